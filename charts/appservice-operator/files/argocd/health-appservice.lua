-- Argo CD health check for platform.example.com/AppService.
-- Install as argocd-cm `resource.customizations.health.platform.example.com_AppService`,
-- or upstream as resource_customizations/platform.example.com/AppService/health.lua.
-- Reads only what the controller writes: status.observedGeneration and the Ready,
-- Stalled, Reconciling, Progressing and Degraded conditions (each stamped with the
-- generation it describes). Stalled (a human must act) is Degraded; Reconciling
-- (progress is possible) is Progressing; Degraded and Progressing alone are read for
-- statuses written by controllers older than the Stalled/Reconciling contract.
local hs = {}

local function condition(conds, type_)
  if conds == nil then
    return nil
  end
  for _, c in ipairs(conds) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local generation = 0
if obj.metadata ~= nil and obj.metadata.generation ~= nil then
  generation = obj.metadata.generation
end
local status = obj.status or {}
local conds = status.conditions
local degraded = condition(conds, "Degraded")
local stalled = condition(conds, "Stalled")

-- Being deleted: the finalizer holds the object until the database and role are gone.
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  if degraded ~= nil and degraded.status == "True" and degraded.message ~= nil and degraded.message ~= "" then
    hs.message = "being deleted: " .. degraded.message
  else
    hs.message = "being deleted"
  end
  return hs
end

-- A Stalled or Degraded condition written for this very generation needs a human even
-- when the status has no observedGeneration yet (written by an older controller).
local function trueNow(c)
  return c ~= nil and c.status == "True"
    and c.observedGeneration ~= nil and c.observedGeneration >= generation
end
local degradedNow = trueNow(stalled) or trueNow(degraded)

if not degradedNow and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(conds, "Ready")
local progressing = condition(conds, "Progressing")
local reconciling = condition(conds, "Reconciling")

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message or stalled.reason or "Stalled"
  return hs
end
-- Progress is possible (a rollout, a dependency retried): Progressing, as kstatus reads
-- it, even while a dependency fails meanwhile (Degraded true as well).
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = reconciling.message or ""
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.message or degraded.reason or "Degraded"
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or ""
  return hs
end
if ready ~= nil and ready.status == "False" then
  if progressing ~= nil and progressing.status == "True" then
    hs.status = "Progressing"
    hs.message = progressing.message or ready.message or ""
  else
    hs.status = "Degraded"
    hs.message = ready.message or ready.reason or "not ready"
  end
  return hs
end
hs.status = "Progressing"
hs.message = "waiting for the controller to report status"
return hs
