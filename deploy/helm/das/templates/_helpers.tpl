{{/* Names and labels shared by every DAS object. */}}

{{- define "das.driverName" -}}mig.das.com{{- end -}}

{{- define "das.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "das.labels" -}}
app.kubernetes.io/part-of: das
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: include "das.selector" (list . "controller") */}}
{{- define "das.selector" -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
{{- end -}}

{{/* Container security context of the components that need no privileges. */}}
{{- define "das.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Logging environment of every component. */}}
{{- define "das.logEnv" -}}
- name: DAS_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: DAS_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
{{- end -}}

{{/* Who may read /metrics (--metrics-auth of every component). */}}
{{- define "das.metricsAuthEnv" -}}
- name: DAS_METRICS_AUTH
  value: {{ ternary "tokenreview" "none" .Values.metrics.authentication | quote }}
{{- end -}}

{{- define "das.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling fields of a component's pod: include "das.scheduling" .Values.controller */}}
{{- define "das.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The webhook's Service name and TLS Secret name. */}}
{{- define "das.webhookService" -}}das-webhook{{- end -}}
{{- define "das.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}{{ required "webhook.tls.secretName is required with webhook.tls.mode=secret" .Values.webhook.tls.secretName }}{{- else -}}das-webhook-tls{{- end -}}
{{- end -}}
