{{/*
Values that contradict each other stop the render with a message naming the value, so that a mistake shows
at `helm template` / `helm install` time rather than as a pod that never schedules or drops requests.
*/}}
{{- define "bert.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.variant (list "cpu" "gpu")) -}}
{{- fail (printf "variant: must be cpu or gpu, not %q" (toString $v.variant)) -}}
{{- end -}}
{{- if and $v.image.digest (not (hasPrefix "sha256:" $v.image.digest)) -}}
{{- fail (printf "image.digest: %q is not a digest (sha256:<64 hex digits>)" $v.image.digest) -}}
{{- end -}}
{{- $gpus := $v.gpu.count | int -}}
{{- if and (eq $v.variant "cpu") (gt $gpus 0) -}}
{{- fail (printf "gpu.count: %d GPUs requested on the cpu variant (the CPU image cannot use them); set variant: gpu or gpu.count: 0" $gpus) -}}
{{- end -}}
{{- if and (eq $v.variant "gpu") (lt $gpus 1) -}}
{{- fail "gpu.count: the gpu variant needs at least 1 GPU per pod (or use variant: cpu)" -}}
{{- end -}}
{{- if lt ($v.server.drainSeconds | float64) 0.0 -}}{{- fail "server.drainSeconds: must be 0 or more" -}}{{- end -}}
{{- if le ($v.server.queueTimeoutSeconds | float64) 0.0 -}}{{- fail "server.queueTimeoutSeconds: must be positive" -}}{{- end -}}
{{- $needed := add $v.shutdown.preStopSleepSeconds (ceil $v.server.drainSeconds) (ceil $v.server.queueTimeoutSeconds) -}}
{{- if not (kindIs "invalid" $v.shutdown.terminationGracePeriodSeconds) -}}
{{- if lt ($v.shutdown.terminationGracePeriodSeconds | int) ($needed | int) -}}
{{- fail (printf "shutdown.terminationGracePeriodSeconds: %d s is shorter than shutdown.preStopSleepSeconds + server.drainSeconds + server.queueTimeoutSeconds = %d s; the kubelet would kill requests still being answered" ($v.shutdown.terminationGracePeriodSeconds | int) ($needed | int)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.probes.grpcReadiness (not $v.server.grpc.enabled) -}}
{{- fail "probes.grpcReadiness: a gRPC readiness probe needs server.grpc.enabled (the gRPC port is closed)" -}}
{{- end -}}
{{- if and $v.server.grpc.enabled (eq ($v.server.grpc.port | int) ($v.server.port | int)) -}}
{{- fail (printf "server.grpc.port: %d is server.port too; HTTP and gRPC each need their own port" ($v.server.grpc.port | int)) -}}
{{- end -}}
{{- $names := list -}}
{{- with $v.model.name -}}{{- $names = append $names . -}}{{- end -}}
{{- range $i, $m := $v.models -}}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$" (toString $m.name)) -}}
{{- fail (printf "models[%d].name: %q is not a model name (letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64; it appears in /models/NAME/...)" $i (toString $m.name)) -}}
{{- end -}}
{{- if has $m.name $names -}}
{{- fail (printf "models[%d].name: %q names two models (model.name and each models[].name must differ)" $i $m.name) -}}
{{- end -}}
{{- $names = append $names $m.name -}}
{{- if not $m.checkpoint -}}
{{- fail (printf "models[%d].checkpoint: model %q has no checkpoint (a path the pod sees, or a Hub id with model.source hub)" $i $m.name) -}}
{{- end -}}
{{- if and (not (hasPrefix "/" (toString $m.checkpoint))) (ne $v.model.source "hub") -}}
{{- fail (printf "models[%d].checkpoint: %q is not an absolute path, and Hub ids are fetched only with model.source hub (the pod reads the Hub cache offline)" $i (toString $m.checkpoint)) -}}
{{- end -}}
{{- range $key := keys $m -}}
{{- if not (has $key (list "name" "checkpoint" "dtype" "rootTask" "classifierPairs" "weight" "maxQueueItems")) -}}
{{- fail (printf "models[%d].%s: not a per-model setting (name, checkpoint, dtype, rootTask, classifierPairs, weight, maxQueueItems)" $i $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.model.source (list "bundled" "pvc" "init" "hub")) -}}
{{- fail (printf "model.source: must be bundled, pvc, init or hub, not %q" (toString $v.model.source)) -}}
{{- end -}}
{{- if and (eq $v.model.source "hub") (not (regexMatch "^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$" (toString $v.model.hub.id))) -}}
{{- fail (printf "model.hub.id: model.source is hub but %q is not a Hub id (org/name, the revision goes in model.hub.revision)" (toString $v.model.hub.id)) -}}
{{- end -}}
{{- if and (eq $v.model.source "hub") $v.model.hub.offline (not $v.model.hub.cache.claimName) -}}
{{- fail "model.hub.offline: an offline start needs a pre-filled cache (model.hub.cache.claimName); an emptyDir starts empty" -}}
{{- end -}}
{{- if and (eq $v.model.source "pvc") (not $v.model.pvc.claimName) (not $v.model.pvc.create) -}}
{{- fail "model.pvc.claimName: model.source is pvc but no claim is named (set model.pvc.claimName, or model.pvc.create: true)" -}}
{{- end -}}
{{- if and (eq $v.model.source "pvc") (not $v.model.pvc.path) -}}
{{- fail "model.pvc.path: the checkpoint directory inside the volume is empty" -}}
{{- end -}}
{{- if and (eq $v.model.source "init") (not $v.model.init.image) -}}
{{- fail "model.init.image: model.source is init but no init container image is given" -}}
{{- end -}}
{{- if and (eq $v.model.source "init") (not $v.model.init.command) -}}
{{- fail "model.init.command: model.source is init but the init container has no command to copy the checkpoint" -}}
{{- end -}}
{{- if and $v.apiKey.create (not $v.apiKey.value) -}}
{{- fail "apiKey.value: apiKey.create is true but the key is empty" -}}
{{- end -}}
{{- if and $v.apiKey.create $v.apiKey.existingSecret -}}
{{- fail "apiKey.existingSecret: set either apiKey.existingSecret or apiKey.create, not both" -}}
{{- end -}}
{{- if and $v.apiKey.value (lt (len $v.apiKey.value) 8) -}}
{{- fail "apiKey.value: the key must be at least 8 characters (the server refuses shorter ones)" -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- if lt ($v.autoscaling.minReplicas | int) 1 -}}{{- fail "autoscaling.minReplicas: must be at least 1" -}}{{- end -}}
{{- if lt ($v.autoscaling.maxReplicas | int) ($v.autoscaling.minReplicas | int) -}}
{{- fail (printf "autoscaling.maxReplicas: %d is below autoscaling.minReplicas %d" ($v.autoscaling.maxReplicas | int) ($v.autoscaling.minReplicas | int)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.podDisruptionBudget.enabled (lt (ternary ($v.autoscaling.minReplicas | int) ($v.replicaCount | int) $v.autoscaling.enabled) 2) -}}
{{- fail "podDisruptionBudget.enabled: with fewer than 2 replicas a disruption budget blocks node drains forever; raise replicaCount / autoscaling.minReplicas or disable it" -}}
{{- end -}}
{{- if and $v.training.distributed.enabled (lt ($v.training.distributed.nodes | int) 2) -}}
{{- fail "training.distributed.nodes: a multi-node run needs at least 2 nodes (use training.job for one)" -}}
{{- end -}}
{{- if $v.corpus.enabled -}}
{{- if not $v.corpus.input -}}{{- fail "corpus.input: the corpus job needs an input (s3://bucket/prefix/ or a path under /data)" -}}{{- end -}}
{{- if not $v.corpus.output -}}{{- fail "corpus.output: the corpus job needs an output (s3://bucket/prefix or a directory under /data)" -}}{{- end -}}
{{- range $name := list "input" "output" -}}
{{- $path := toString (get $v.corpus $name) -}}
{{- if and (not (hasPrefix "s3://" $path)) (not (hasPrefix "/data/" $path)) -}}
{{- fail (printf "corpus.%s: %q is neither s3://... nor a path under /data (where corpus.storage.claimName is mounted)" $name $path) -}}
{{- end -}}
{{- end -}}
{{- if and (include "bert.corpusNeedsVolume" $) (not $v.corpus.storage.claimName) -}}
{{- fail "corpus.storage.claimName: the corpus job's input or output is a path under /data, which needs a claim (or use s3:// for both)" -}}
{{- end -}}
{{- end -}}
{{- if and (or $v.training.job.enabled $v.training.distributed.enabled) (not $v.training.storage.claimName) (not $v.training.storage.create) -}}
{{- fail "training.storage.claimName: the trainer needs a volume (set training.storage.claimName, or training.storage.create: true)" -}}
{{- end -}}
{{- end -}}
