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
{{/* The model pods' account, in the workload namespace: no permissions, no token. */}}
{{- define "lmedge.modelSA" -}}{{ include "lmedge.fullname" . }}-model{{- end }}
{{/* Audience of the service-account tokens the controller and node agents present to gateways. */}}
{{- define "lmedge.gatewayAudience" -}}lmedge-gateway{{- end }}

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
{{/* The in-chart MongoDB's address (no credentials). */}}
{{- define "lmedge.mongodbHost" -}}
{{- printf "%s-mongodb.%s.svc:27017" (include "lmedge.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
A generated secret kept across upgrades: (dict "ctx" $ "name" SECRET "key" KEY
"length" N) returns the live Secret's value, else a new random one. Helm's
lookup sees nothing under `helm template`, which then renders a fresh one.
*/}}
{{- define "lmedge.keptRandom" -}}
{{- $live := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- if and $live $live.data (hasKey $live.data .key) }}
{{- index $live.data .key | b64dec }}
{{- else }}
{{- randAlphaNum (int .length) }}
{{- end }}
{{- end }}

{{- define "lmedge.userTokenSecretName" -}}
{{- default (printf "%s-gateway-token" (include "lmedge.fullname" .)) .Values.gateway.existingTokenSecret }}
{{- end }}

{{- define "lmedge.llmSecretName" -}}
{{- default (printf "%s-llm" (include "lmedge.fullname" .)) .Values.llm.existingSecret }}
{{- end }}
{{- define "lmedge.llmSecretKey" -}}
{{- if .Values.llm.existingSecret }}{{ .Values.llm.existingSecretKey }}{{ else }}api-key{{ end }}
{{- end }}
{{- define "lmedge.llmEnabled" -}}
{{- if or .Values.llm.baseUrl .Values.llm.apiKey .Values.llm.existingSecret .Values.agentLLM.enabled }}true{{ end }}
{{- end }}

{{- define "lmedge.gatewayEnabled" -}}
{{- if and .Values.gateway.enabled .Values.lmServices }}true{{ end }}
{{- end }}

{{/*
Environment every lmedge process shares: where the store URI is (a mounted
Secret file: it holds the database password), the LLM. No secret is ever an
environment variable's value.
*/}}
{{- define "lmedge.commonEnv" -}}
- name: LMEDGE_STORE_FILE
  value: /var/run/secrets/lmedge/store/uri
{{- if include "lmedge.llmEnabled" . }}
{{- if .Values.agentLLM.enabled }}
{{- /* the in-chart agent LLM (agent-llm.yaml) wins over llm.baseUrl */}}
- name: LMEDGE_LLM_BASE_URL
  value: {{ printf "http://%s-agent-llm.%s.svc:%v/v1" (include "lmedge.fullname" .) .Release.Namespace .Values.agentLLM.port | quote }}
- name: LMEDGE_LLM_MODEL
  value: {{ .Values.agentLLM.model.name | quote }}
{{- else }}
{{- with .Values.llm.baseUrl }}
- name: LMEDGE_LLM_BASE_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.llm.model }}
- name: LMEDGE_LLM_MODEL
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if or .Values.llm.apiKey .Values.llm.existingSecret }}
- name: LMEDGE_LLM_API_KEY_FILE
  value: /var/run/secrets/lmedge/llm/api-key
{{- end }}
{{- end }}
{{- end }}

{{/* The store URI, mounted as a file. */}}
{{- define "lmedge.storeVolume" -}}
- name: store
  secret:
    secretName: {{ include "lmedge.storeSecretName" . }}
    items: [{key: {{ include "lmedge.storeSecretKey" . }}, path: uri}]
{{- end }}
{{- define "lmedge.storeMount" -}}
- {name: store, mountPath: /var/run/secrets/lmedge/store, readOnly: true}
{{- end }}

{{/*
The token a controller or node-agent pod presents to gateways: its own
service-account token, bound to the pod (so to its node) and valid for the
gateways' audience only; the kubelet rotates it. Gateways verify it with a
TokenReview (lmedge/dataplane/auth.py).
*/}}
{{- define "lmedge.gatewayTokenVolume" -}}
- name: gateway-token
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ include "lmedge.gatewayAudience" . }}
          expirationSeconds: 3600
          path: token
{{- end }}
{{- define "lmedge.gatewayTokenMount" -}}
- {name: gateway-token, mountPath: /var/run/secrets/lmedge/gateway, readOnly: true}
{{- end }}

{{/*
Spill files: what a process could not write to the store while it was
unreachable waits here (the root filesystem is read-only). An emptyDir
outlives container restarts, not the pod. The image's working directory is
/home/lmedge, so this is the default ./.lmedge/spill. Each container gets
its own subdirectory (pass its name): spill files are named by process id,
and two containers' processes can have the same one.
*/}}
{{- define "lmedge.spillVolume" -}}
- name: spill
  emptyDir: {sizeLimit: {{ .Values.spill.sizeLimit }}}
{{- end }}
{{- define "lmedge.spillMount" -}}
- {name: spill, mountPath: /home/lmedge/.lmedge/spill, subPath: {{ . }}}
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
