{{- define "clusterhealth.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "clusterhealth.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "clusterhealth.labels" -}}
{{ include "clusterhealth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The remediator's own name, so that the agent's selectors (its DaemonSet, its Service) never
match the remediator's pods; its ServiceMonitor makes it the job name, clusterhealth-remediate. */ -}}
{{- define "clusterhealth.remediatorSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-remediate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "clusterhealth.remediatorLabels" -}}
{{ include "clusterhealth.remediatorSelectorLabels" . }}
app.kubernetes.io/component: remediator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
