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
{{- end }}

{{/*
The serving certificate in selfSigned mode: reuse the Secret from the cluster when it is
there (so `helm upgrade` does not rotate the CA under running API servers), else generate.
Returns a dict with ca, cert, key (PEM), computed once per render.
*/}}
{{- define "aso.selfSignedCert" -}}
{{- $secretName := include "aso.webhook.tlsSecret" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName -}}
{{- if and $existing $existing.data (index $existing.data "ca.crt") (index $existing.data "tls.crt") (index $existing.data "tls.key") -}}
ca: {{ index $existing.data "ca.crt" | b64dec | quote }}
cert: {{ index $existing.data "tls.crt" | b64dec | quote }}
key: {{ index $existing.data "tls.key" | b64dec | quote }}
{{- else -}}
{{- $svc := include "aso.webhook.fullname" . -}}
{{- $days := int .Values.certificates.selfSignedValidityDays -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $dns := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc .Release.Namespace) nil $dns $days $ca -}}
ca: {{ $ca.Cert | quote }}
cert: {{ $cert.Cert | quote }}
key: {{ $cert.Key | quote }}
{{- end -}}
{{- end }}

{{/* jemalloc samples allocations from the start (what --profiling would otherwise
restart the binary for); must match telemetry::profiling::JEMALLOC_PROFILING_CONF. */}}
{{- define "aso.jemallocProfiling" -}}
- {name: _RJEM_MALLOC_CONF, value: "background_thread:true,prof:true,prof_active:true,lg_prof_sample:19"}
{{- end }}
