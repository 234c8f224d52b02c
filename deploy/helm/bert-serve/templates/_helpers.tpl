{{/* Names and labels. */}}
{{- define "bert.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "bert.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bert.labels" -}}
{{ include "bert.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "bert.image" -}}
{{- $tag := .Values.image.tag | default (ternary (printf "%s-cpu" .Chart.AppVersion) .Chart.AppVersion (eq .Values.variant "cpu")) -}}
{{- if .Values.image.digest -}}{{ printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else -}}{{ printf "%s:%s" .Values.image.repository $tag }}{{- end -}}
{{- end -}}

{{- define "bert.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name | default (include "bert.fullname" .) }}
{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{/* The grace period: the value given, or preStop + drain + queue deadline + 10 s. */}}
{{- define "bert.gracePeriod" -}}
{{- $floor := add .Values.shutdown.preStopSleepSeconds (ceil .Values.server.drainSeconds) (ceil .Values.server.queueTimeoutSeconds) -}}
{{- if kindIs "invalid" .Values.shutdown.terminationGracePeriodSeconds -}}{{ add $floor 10 }}
{{- else -}}{{ .Values.shutdown.terminationGracePeriodSeconds | int }}{{- end -}}
{{- end -}}

{{- define "bert.checkpointPath" -}}
{{- if eq .Values.model.source "pvc" -}}{{ printf "/models/%s" .Values.model.pvc.path }}
{{- else if eq .Values.model.source "init" -}}{{ printf "/models/%s" .Values.model.init.path }}
{{- else if eq .Values.model.source "hub" -}}{{ include "bert.hubSpec" . }}
{{- else -}}{{ .Values.model.bundled.path }}{{- end -}}
{{- end -}}

{{/* BERT_CHECKPOINT: the default model (named when model.name is set), then each of .Values.models, as a JSON
list of NAME=SOURCE (the service reads a JSON list; a path may hold a comma). */}}
{{- define "bert.checkpoints" -}}
{{- $default := include "bert.checkpointPath" . -}}
{{- if not .Values.models -}}
{{- if and .Values.model.name $default -}}{{ printf "%s=%s" .Values.model.name $default }}{{- else -}}{{ $default }}{{- end -}}
{{- else -}}
{{- $first := $default | default "/app/checkpoints/minilm-wikipedia" -}}
{{- $all := list (ternary (printf "%s=%s" .Values.model.name $first) $first (ne .Values.model.name "")) -}}
{{- range .Values.models -}}{{- $all = append $all (printf "%s=%s" .name .checkpoint) -}}{{- end -}}
{{- toJson $all -}}
{{- end -}}
{{- end -}}

{{/* BERT_MODEL_SETTING: each of .Values.models' own settings, as a JSON list of NAME:KEY=VALUE ("" when none). */}}
{{- define "bert.modelSettings" -}}
{{- $keys := dict "dtype" "dtype" "rootTask" "root_task" "classifierPairs" "classifier_pairs" "weight" "weight" "maxQueueItems" "max_queue_items" -}}
{{- $all := list -}}
{{- range $m := .Values.models -}}
{{- range $key := list "dtype" "rootTask" "classifierPairs" "weight" "maxQueueItems" -}}
{{- if hasKey $m $key -}}{{- $all = append $all (printf "%s:%s=%v" $m.name (get $keys $key) (get $m $key)) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $all -}}{{ toJson $all }}{{- end -}}
{{- end -}}

{{/* The Hub ids among .Values.models (fetched by the hub init container with model.hub.id). */}}
{{- define "bert.extraHubSpecs" -}}
{{- range .Values.models -}}{{- if not (hasPrefix "/" .checkpoint) -}}{{ printf " %s" .checkpoint }}{{- end -}}{{- end -}}
{{- end -}}

{{- define "bert.modelClaim" -}}
{{ .Values.model.pvc.claimName | default (printf "%s-models" (include "bert.fullname" .)) }}
{{- end -}}

{{- define "bert.trainingClaim" -}}
{{ .Values.training.storage.claimName | default (printf "%s-training" (include "bert.fullname" .)) }}
{{- end -}}

{{- define "bert.apiKeySecret" -}}
{{ .Values.apiKey.existingSecret | default (printf "%s-api-key" (include "bert.fullname" .)) }}
{{- end -}}

{{/* A Hub id as --checkpoint takes it: org/name or org/name@revision. */}}
{{- define "bert.hubSpec" -}}
{{ .Values.model.hub.id }}{{ with .Values.model.hub.revision }}@{{ . }}{{ end }}
{{- end -}}

{{/* Whether the API pod needs egress: an init container fetches its model from outside. */}}
{{- define "bert.fetchesModel" -}}
{{- if or (eq .Values.model.source "init") (and (eq .Values.model.source "hub") (not .Values.model.hub.offline)) -}}true{{- end -}}
{{- end -}}

{{/* The corpus job's pods: a name label of their own, so that no selector of the API's matches them. */}}
{{- define "bert.corpusLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-corpus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: corpus
{{- end -}}

{{/* Whether the corpus job reads or writes a local path, which then lives on corpus.storage's claim at /data. */}}
{{- define "bert.corpusNeedsVolume" -}}
{{- if or (not (hasPrefix "s3://" .Values.corpus.input)) (not (hasPrefix "s3://" .Values.corpus.output)) -}}true{{- end -}}
{{- end -}}
