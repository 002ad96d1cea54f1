-- Argo CD health check for platform.example.com/DatabaseClass.
-- Install as argocd-cm `resource.customizations.health.platform.example.com_DatabaseClass`,
-- or upstream as resource_customizations/platform.example.com/DatabaseClass/health.lua.
-- Reads status.observedGeneration and the Reachable condition: whether the controller
-- could log in to the server with the class's admin credentials, and if not, why.
local hs = {}
local generation = 0
if obj.metadata ~= nil and obj.metadata.generation ~= nil then
  generation = obj.metadata.generation
end
local status = obj.status or {}

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
  return hs
end
if status.observedGeneration == nil or status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to observe generation " .. tostring(generation)
  return hs
end

local reachable = nil
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Reachable" then
      reachable = c
    end
  end
end
if reachable == nil or reachable.status == "Unknown" then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to reach the server"
elseif reachable.status == "True" then
  hs.status = "Healthy"
  hs.message = reachable.message or ""
else
  hs.status = "Degraded"
  hs.message = reachable.message or reachable.reason or "unreachable"
end
return hs
