{{/* Chart name, truncated to the 63-character DNS label limit. */}}
{{- define "lmedge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource-name prefix: the release name, plus the chart name unless already in it. */}}
{{- define "lmedge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lmedge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lmedge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lmedge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Standard labels; pass (dict "ctx" $ "component" "controller"). */}}
{{- define "lmedge.labels" -}}
helm.sh/chart: {{ include "lmedge.chart" .ctx }}
{{ include "lmedge.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: lmedge
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "lmedge.componentSelector" -}}
{{ include "lmedge.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "lmedge.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "lmedge.controllerSA" -}}{{ include "lmedge.fullname" . }}-controller{{- end }}
{{- define "lmedge.nodeAgentSA" -}}{{ include "lmedge.fullname" . }}-node-agent{{- end }}

{{- define "lmedge.timeSlicingName" -}}
{{- default (printf "%s-time-slicing" (include "lmedge.fullname" .)) .Values.timeSlicing.name }}
{{- end }}
{{- define "lmedge.timeSlicingNamespace" -}}
{{- default .Release.Namespace .Values.timeSlicing.namespace }}
{{- end }}

{{/* Secret and key holding the store URI. */}}
{{- define "lmedge.storeSecretName" -}}
{{- if and (not .Values.mongodb.enabled) .Values.mongodb.existingSecret }}
{{- .Values.mongodb.existingSecret }}
{{- else }}
{{- include "lmedge.fullname" . }}-store
{{- end }}
{{- end }}
{{- define "lmedge.storeSecretKey" -}}
{{- if and (not .Values.mongodb.enabled) .Values.mongodb.existingSecret }}
{{- .Values.mongodb.existingSecretKey }}
{{- else -}}
uri
{{- end }}
{{- end }}
{{- define "lmedge.mongodbUri" -}}
{{- if .Values.mongodb.enabled }}
{{- printf "mongodb://%s-mongodb.%s.svc:27017/%s" (include "lmedge.fullname" .) .Release.Namespace .Values.mongodb.database }}
{{- else }}
{{- .Values.mongodb.uri }}
{{- end }}
{{- end }}

{{- define "lmedge.controlSecretName" -}}
{{- default (printf "%s-control" (include "lmedge.fullname" .)) .Values.controlToken.existingSecret }}
{{- end }}

{{- define "lmedge.llmSecretName" -}}
{{- default (printf "%s-llm" (include "lmedge.fullname" .)) .Values.llm.existingSecret }}
{{- end }}
{{- define "lmedge.llmSecretKey" -}}
{{- if .Values.llm.existingSecret }}{{ .Values.llm.existingSecretKey }}{{ else }}api-key{{ end }}
{{- end }}
{{- define "lmedge.llmEnabled" -}}
{{- if or .Values.llm.baseUrl .Values.llm.apiKey .Values.llm.existingSecret }}true{{ end }}
{{- end }}

{{- define "lmedge.gatewayEnabled" -}}
{{- if and .Values.gateway.enabled .Values.lmServices }}true{{ end }}
{{- end }}

{{/* Environment every lmedge process shares: the store, the control token, the LLM. */}}
{{- define "lmedge.commonEnv" -}}
- name: LMEDGE_STORE
  valueFrom:
    secretKeyRef: {name: {{ include "lmedge.storeSecretName" . }}, key: {{ include "lmedge.storeSecretKey" . }}}
- name: LMEDGE_CONTROL_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "lmedge.controlSecretName" . }}, key: token}
{{- if include "lmedge.llmEnabled" . }}
{{- with .Values.llm.baseUrl }}
- name: LMEDGE_LLM_BASE_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.llm.model }}
- name: LMEDGE_LLM_MODEL
  value: {{ . | quote }}
{{- end }}
{{- if or .Values.llm.apiKey .Values.llm.existingSecret }}
- name: LMEDGE_LLM_API_KEY_FILE
  value: /var/run/secrets/lmedge/llm/api-key
{{- end }}
{{- end }}
{{- end }}

{{/* The LLM key, mounted as a file (never an environment variable). */}}
{{- define "lmedge.llmVolume" -}}
{{- if or .Values.llm.apiKey .Values.llm.existingSecret }}
- name: llm-key
  secret:
    secretName: {{ include "lmedge.llmSecretName" . }}
    items: [{key: {{ include "lmedge.llmSecretKey" . }}, path: api-key}]
{{- end }}
{{- end }}
{{- define "lmedge.llmMount" -}}
{{- if or .Values.llm.apiKey .Values.llm.existingSecret }}
- {name: llm-key, mountPath: /var/run/secrets/lmedge/llm, readOnly: true}
{{- end }}
{{- end }}
