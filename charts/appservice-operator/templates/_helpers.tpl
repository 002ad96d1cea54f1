{{/* Name of the chart, overridable. */}}
{{- define "aso.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name. */}}
{{- define "aso.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "aso.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "aso.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "aso.webhook.fullname" -}}{{ include "aso.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end }}
{{- define "aso.controller.fullname" -}}{{ include "aso.fullname" . | trunc 52 | trimSuffix "-" }}-controller{{- end }}
{{- define "aso.webhook.tlsSecret" -}}
{{- if eq .Values.certificates.mode "secret" }}{{ .Values.certificates.existingSecret }}{{ else }}{{ include "aso.webhook.fullname" . }}-tls{{ end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "aso.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "aso.metaLabels" . }}
{{- end }}

{{/* The labels of "aso.labels" that are not part of any selector (for Pod templates,
which carry the selector labels separately). */}}
{{- define "aso.metaLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: {{ include "aso.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component (webhook or controller). */}}
{{- define "aso.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aso.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "aso.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Pod and container security that passes the "restricted" Pod Security Standard. */}}
{{- define "aso.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "aso.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Namespaces the controller never reconciles in (a list): kube-system, the release
namespace and controller.excludeNamespaces. The controller's flag and its admission
policy both read this one list. */}}
{{- define "aso.controller.excludedNamespaces" -}}
{{- /* dig, not .Values.controller.excludeNamespaces: a value added after the first
release is missing under `helm upgrade --reuse-values` (the upgrade command of docs/operators/upgrading.md),
which keeps the old release's values and not this chart's defaults. */ -}}
{{- toJson (concat (list "kube-system" .Release.Namespace) (dig "controller" "excludeNamespaces" (list) .Values.AsMap) | uniq) }}
{{- end }}

{{/* controller.expose.gateway as `namespace/name` (the controller's EXPOSE_GATEWAY),
empty when no Gateway is named; both or neither must be set. dig: the value is newer
than the first release (see above). */}}
{{- define "aso.controller.exposeGateway" -}}
{{- $namespace := dig "controller" "expose" "gateway" "namespace" "" .Values.AsMap -}}
{{- $name := dig "controller" "expose" "gateway" "name" "" .Values.AsMap -}}
{{- if and $namespace $name -}}
{{ $namespace }}/{{ $name }}
{{- else if or $namespace $name -}}
{{- fail "controller.expose.gateway needs both namespace and name (or neither)" -}}
{{- end -}}
{{- end }}

{{/* controller.expose.ingressClassName, when no Gateway is named (the Gateway wins). */}}
{{- define "aso.controller.exposeIngressClass" -}}
{{- if not (include "aso.controller.exposeGateway" .) -}}
{{- dig "controller" "expose" "ingressClassName" "" .Values.AsMap -}}
{{- end -}}
{{- end }}

{{/* admissionPolicies.enabled, true when the release's values predate it. */}}
{{- define "aso.admissionPolicies" -}}
{{- if dig "admissionPolicies" "enabled" true .Values.AsMap }}true{{ end }}
{{- end }}

{{/* The user name the API server gives the controller's ServiceAccount. */}}
{{- define "aso.controller.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "aso.controller.fullname" . }}
{{- end }}

{{/* Namespaces the webhooks never see. */}}
{{- define "aso.webhook.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) | nindent 6 }}
{{- with .Values.webhook.namespaceSelectorExpressions }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if and (dig "followShardNamespaces" true .Values.webhook) (dig "sharding" "enabled" false .Values.controller) }}
{{- with (dig "sharding" "namespaceSelector" list .Values.controller) }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* controller.sharding.namespaceSelector (matchExpressions) in the label selector
syntax of --namespace-selector: `k in (a,b)`, `k notin (a,b)`, `k`, `!k`. */}}
{{- define "aso.controller.namespaceSelector" -}}
{{- $parts := list -}}
{{- range (dig "sharding" "namespaceSelector" list .Values.controller) -}}
{{- $values := .values | default list -}}
{{- if eq .operator "In" -}}
{{- if not $values }}{{ fail (printf "controller.sharding.namespaceSelector: %s In needs values" .key) }}{{ end -}}
{{- $parts = append $parts (printf "%s in (%s)" .key (join "," $values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- if not $values }}{{ fail (printf "controller.sharding.namespaceSelector: %s NotIn needs values" .key) }}{{ end -}}
{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," $values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $parts = append $parts .key -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $parts = append $parts (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- join "," $parts -}}
{{- end }}

{{/* The Secret the webhook keeps its CA in (selfSigned mode). */}}
{{- define "aso.webhook.caSecret" -}}{{ include "aso.webhook.fullname" . }}-ca{{- end }}

{{/* Whether webhook Pods get a token. */}}
{{- define "aso.webhook.needsToken" -}}
{{- /* Always: the webhook watches AppServices, which writes of /scale are judged on (and,
when enabled, namespace labels and its selfSigned CA). */ -}}
true
{{- end }}

{{/* The configurations whose caBundle the webhook keeps (selfSigned mode): both webhook
configurations, and the CRD when the chart renders it (a CRD managed elsewhere keeps
the bundle its owner gives it). */}}
{{- define "aso.webhook.caBundleTargets" -}}
{{- $svc := include "aso.webhook.fullname" . -}}
{{- $targets := list (printf "mutating/%s" $svc) (printf "validating/%s" $svc) -}}
{{- if .Values.crd.install }}{{ $targets = append $targets "crd/appservices.platform.example.com" }}{{ end -}}
{{- toJson $targets }}
{{- end }}

{{/* The names the API server calls the webhook by: its serving certificate's SANs. */}}
{{- define "aso.webhook.dnsNames" -}}
{{- $svc := include "aso.webhook.fullname" . -}}
{{- toJson (list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace)) }}
{{- end }}

{{/*
selfSigned mode: the caBundle a configuration has in the cluster now, written there by
the webhook, rendered back unchanged so `helm upgrade` never takes it away (and the
upgrade from a chart that minted its CA with Helm keeps the old CA until the webhook has
added its own). Under `helm template` lookup finds nothing: no caBundle is rendered, the
output is the same every time, and the running webhook keeps the live one. Arguments:
kind, name, entry (a webhook entry's name; empty for the CRD's conversion webhook).
*/}}
{{- define "aso.webhook.liveCaBundle" -}}
{{- $apiVersion := ternary "apiextensions.k8s.io/v1" "admissionregistration.k8s.io/v1" (eq .kind "CustomResourceDefinition") -}}
{{- $obj := lookup $apiVersion .kind "" .name -}}
{{- if eq .kind "CustomResourceDefinition" -}}
{{- dig "spec" "conversion" "webhook" "clientConfig" "caBundle" "" $obj -}}
{{- else -}}
{{- range (dig "webhooks" (list) $obj) }}{{ if eq .name $.entry }}{{ dig "clientConfig" "caBundle" "" . }}{{ end }}{{ end -}}
{{- end -}}
{{- end }}

{{/* jemalloc samples allocations from the start (what --profiling would otherwise
restart the binary for); must match telemetry::profiling::JEMALLOC_PROFILING_CONF. */}}
{{- define "aso.jemallocProfiling" -}}
- {name: _RJEM_MALLOC_CONF, value: "background_thread:true,prof:true,prof_active:true,lg_prof_sample:19"}
{{- end }}

{{/*
Who may call the webhook port, as a JSON list of NetworkPolicy peers: the API server.
networkPolicy.apiServerCidrs and apiServerPeers when set; else, at install time, the
addresses of the `kubernetes` Service's EndpointSlices (where the API server is reached,
and on self-managed control planes where it calls from); else (helm template, where
nothing can be looked up) an empty list: any source, and NOTES.txt says so.
*/}}
{{- define "aso.networkPolicy.apiServerPeers" -}}
{{- $peers := list }}
{{- range .Values.networkPolicy.apiServerCidrs }}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" .)) }}
{{- end }}
{{- range .Values.networkPolicy.apiServerPeers }}
{{- $peers = append $peers . }}
{{- end }}
{{- if and (not $peers) .Values.networkPolicy.discoverApiServer }}
{{- $slices := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "" }}
{{- range ($slices.items | default list) }}
{{- if eq (index (.metadata.labels | default dict) "kubernetes.io/service-name" | default "") "kubernetes" }}
{{- range (.endpoints | default list) }}
{{- range (.addresses | default list) }}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" (printf "%s/%s" . (ternary "128" "32" (contains ":" .))))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $peers }}
{{- end }}
