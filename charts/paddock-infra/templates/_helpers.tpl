{{/* The sandbox namespace; rendering stops without it. */}}
{{- define "paddock-infra.namespace" -}}
{{- required "namespace.name is required: the namespace Paddock's sandboxes and server run in (--set namespace.name=paddock)" .Values.namespace.name -}}
{{- end -}}

{{/* Labels of every object this chart makes (Helm manages them; Paddock manages the Pods). */}}
{{- define "paddock-infra.labels" -}}
app.kubernetes.io/name: paddock-infra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: paddock
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "paddock-infra.apiServerCidrs" -}}
{{- if not .Values.apiServer.cidrs -}}
{{- fail "apiServer.cidrs is required: the Kubernetes API server's addresses (its Service IP and its endpoints, e.g. --set 'apiServer.cidrs={10.96.0.1/32,10.0.0.5/32}'); the egress backstop lets only the server reach them" -}}
{{- end -}}
{{- toJson .Values.apiServer.cidrs -}}
{{- end -}}

{{- define "paddock-infra.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The PriorityClass of a role (platform, interactive, batch): the chart's own, or the one named. */}}
{{- define "paddock-infra.priorityClass" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- if $root.Values.priorityClasses.create -}}
{{- printf "paddock-%s-%s" (include "paddock-infra.namespace" $root) $role -}}
{{- else -}}
{{- index $root.Values.priorityClasses $role -}}
{{- end -}}
{{- end -}}
