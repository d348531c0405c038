{{/* Labels on every object of the chart. */}}
{{- define "lockwarden.labels" -}}
app.kubernetes.io/name: lockwarden
app.kubernetes.io/part-of: lockwarden
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The manager pods' selector: the same labels as config/default. */}}
{{- define "lockwarden.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: lockwarden
{{- end }}

{{/* The manager image. */}}
{{- define "lockwarden.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The webhook serving certificate's Secret (and cert-manager Certificate). */}}
{{- define "lockwarden.webhookCertSecret" -}}
lockwarden-webhook-server-cert
{{- end }}

{{/* Annotations on the webhook configurations: cert-manager's CA injection. */}}
{{- define "lockwarden.webhookAnnotations" -}}
{{- if .Values.webhook.certManager.enabled -}}
cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "lockwarden.webhookCertSecret" . }}
{{- end -}}
{{- end }}
