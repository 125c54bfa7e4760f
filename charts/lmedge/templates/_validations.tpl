{{/*
Checks of values that only make sense together; each fails the render with
one line saying what to set. Called from NOTES-independent templates via
`include "lmedge.validate" .` in every rendered workload.
*/}}
{{- define "lmedge.validate" -}}
{{- if and (not .Values.mongodb.enabled) (not .Values.mongodb.uri) (not .Values.mongodb.existingSecret) }}
{{- fail "mongodb.enabled=false needs mongodb.uri (e.g. mongodb://mongo.db:27017/lmedge) or mongodb.existingSecret" }}
{{- end }}
{{- if and .Values.mongodb.enabled (or .Values.mongodb.uri .Values.mongodb.existingSecret) }}
{{- fail "mongodb.uri and mongodb.existingSecret are for an external MongoDB: set mongodb.enabled=false, or drop them" }}
{{- end }}
{{- if and .Values.mongodb.uri (not (regexMatch "^mongodb(\\+srv)?://" .Values.mongodb.uri)) }}
{{- fail (printf "mongodb.uri must start with mongodb:// or mongodb+srv://, got %q" .Values.mongodb.uri) }}
{{- end }}
{{- if and .Values.llm.baseUrl (not .Values.llm.apiKey) (not .Values.llm.existingSecret) }}
{{- fail "llm.baseUrl is set: give its key with llm.apiKey or llm.existingSecret (a Secret with key llm.existingSecretKey)" }}
{{- end }}
{{- if and .Values.llm.apiKey .Values.llm.existingSecret }}
{{- fail "set llm.apiKey or llm.existingSecret, not both" }}
{{- end }}
{{- if and .Values.agentLLM.enabled (or .Values.llm.baseUrl .Values.llm.apiKey .Values.llm.existingSecret) }}
{{- fail "agentLLM.enabled points the agents at the in-chart LLM: leave llm.baseUrl, llm.apiKey and llm.existingSecret unset" }}
{{- end }}
{{- if and (include "lmedge.llmEnabled" .) (not .Values.agentLLM.enabled) (not .Values.llm.model) }}
{{- fail "an LLM is configured: set llm.model (e.g. gpt-4.1-mini)" }}
{{- end }}
{{- if and .Values.gateway.enabled .Values.gateway.hostPort (not (contains "{node}" .Values.gateway.urlTemplate)) }}
{{- fail (printf "gateway.urlTemplate must contain {node}, got %q" .Values.gateway.urlTemplate) }}
{{- end }}
{{- if and .Values.exporters.serviceMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) }}
{{- fail "exporters.serviceMonitor.enabled needs the Prometheus Operator CRDs (monitoring.coreos.com/v1 ServiceMonitor) in the cluster" }}
{{- end }}
{{- if and .Values.nodeAgent.scrapeExporters .Values.exporters.nodeExporter.enabled (ne (int .Values.exporters.nodeExporter.port) 9100) }}
{{- fail "the node agents scrape node-exporter on 9100: keep exporters.nodeExporter.port=9100 or set nodeAgent.scrapeExporters=false" }}
{{- end }}
{{- if and .Values.nodeAgent.scrapeExporters .Values.exporters.dcgmExporter.enabled (ne (int .Values.exporters.dcgmExporter.port) 9400) }}
{{- fail "the node agents scrape dcgm-exporter on 9400: keep exporters.dcgmExporter.port=9400 or set nodeAgent.scrapeExporters=false" }}
{{- end }}
{{- end }}
