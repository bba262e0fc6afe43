{{- define "paddock.fullname" -}}
{{- if contains "paddock" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-paddock" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "paddock.selector" -}}
app.kubernetes.io/name: paddock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* Labels of the objects Helm manages. */}}
{{- define "paddock.labels" -}}
{{ include "paddock.selector" . }}
app.kubernetes.io/part-of: paddock
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "paddock.apiKeySecret" -}}
{{- .Values.apiKey.existingSecret | default (printf "%s-api-key" (include "paddock.fullname" .)) -}}
{{- end -}}

{{/* The PriorityClass of a role (platform, interactive, batch): the one named, else the one
paddock-infra makes for this namespace. */}}
{{- define "paddock.priorityClass" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- index $root.Values.priorityClasses $role | default (printf "paddock-%s-%s" $root.Release.Namespace $role) -}}
{{- end -}}
