{{/* How many nodes a trainer of `gpus` GPUs spans (dict: root, gpus, poolName): 1 up to
gpu.perNode, else gpus / gpu.perNode, which must divide evenly. */}}
{{- define "atgrpo.trainerNodeCount" -}}
{{- $perNode := int .root.Values.gpu.perNode -}}
{{- if le .gpus $perNode }}1
{{- else if mod .gpus $perNode }}
{{- fail (printf "atgrpo: invalid values: pools.%s.trainer.gpus is %d, more than a node's %d (gpu.perNode) and not a multiple of it: a trainer past one node runs gpu.perNode ranks on each node. Set gpus to %d or %d" .poolName .gpus $perNode (mul (div .gpus $perNode) $perNode) (mul (add1 (div .gpus $perNode)) $perNode)) }}
{{- else }}{{ div .gpus $perNode }}
{{- end }}
{{- end -}}

{{/*
A trainer pool past one node (dict: ctx, pod (atgrpo.podSpec's arguments), nodes, checkpoints,
poolName, annotations): a LeaderWorkerSet of one group, `nodes` pods, each running torchrun over its node's
GPUs. The leader (worker index 0) holds global rank 0, which serves gRPC; the workers' ranks
follow it and serve nothing, so they have no ports and no probes. A failed pod restarts the whole
group (RecreateGroupOnPodRestart): a rank that left the process group cannot rejoin it, and the
restarted trainer resumes from the last checkpoint as a one-pod trainer does.

Every rank writes its own shards of a checkpoint and reads every shard on resume, so the
checkpoints live on one volume all the pods mount: a ReadWriteMany claim.
*/}}
{{- define "atgrpo.trainerNodes" -}}
{{- $ctx := .ctx -}}
{{- $root := $ctx.root -}}
{{- $name := include "atgrpo.componentName" $ctx -}}
{{- if not (has "ReadWriteMany" .checkpoints.accessModes) }}
{{- fail (printf "atgrpo: invalid values: pools.%s.trainer runs on %d nodes, and every node's ranks write and read the same checkpoint: set pools.%s.trainer.checkpoints.accessModes to [ReadWriteMany] (with a storageClassName whose volumes allow it: NFS, CephFS, a cloud file store)" .poolName .nodes .poolName) }}
{{- end }}
---
# The checkpoints of pool {{ .poolName }}'s trainer, shared by its {{ .nodes }} nodes.
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ $name }}-data
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" $ctx | nindent 4 }}
  annotations:
    # Keep checkpoints when the release is uninstalled: they are the run's product.
    helm.sh/resource-policy: keep
spec:
  accessModes:
    {{- toYaml .checkpoints.accessModes | nindent 4 }}
  {{- with .checkpoints.storageClassName }}
  storageClassName: {{ . }}
  {{- end }}
  resources:
    requests:
      storage: {{ .checkpoints.size }}
---
# The trainer of pool {{ .poolName }} over {{ .nodes }} nodes (leaderworkerset.x-k8s.io, which
# must be installed in the cluster: docs/deploy.md, "Trainers past one node").
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  # Not the trainer's own name: LWS makes a headless Service of its name for the pods' hostnames
  # (LWS_LEADER_ADDRESS), listing them before they are ready, as the rendezvous needs; the
  # trainer's Service (that name) lists the leader only once it serves.
  name: {{ $name }}-nodes
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" $ctx | nindent 4 }}
spec:
  replicas: 1
  startupPolicy: LeaderCreated
  leaderWorkerTemplate:
    size: {{ .nodes }}
    restartPolicy: RecreateGroupOnPodRestart
    leaderTemplate:
      {{- include "atgrpo.trainerPodTemplate" (dict "ctx" $ctx "pod" .pod "annotations" .annotations) | nindent 6 }}
    workerTemplate:
      {{- include "atgrpo.trainerPodTemplate" (dict "ctx" $ctx "pod" (omit .pod "server" "startup") "annotations" .annotations) | nindent 6 }}
{{- end -}}

{{- define "atgrpo.trainerPodTemplate" -}}
metadata:
  labels:
    {{- include "atgrpo.labels" .ctx | nindent 4 }}
    {{- if .pod.server }}
    atgrpo.dev/metrics: "true"
    {{- end }}
  annotations:
    checksum/run-config: {{ include "atgrpo.runConfig" .ctx.root | sha256sum }}
    {{- with .annotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- include "atgrpo.podSpec" .pod | nindent 2 }}
{{- end -}}

{{/*
What a trainer past one node adds for its network (dict: root, resources): a YAML map of env (the
NCCL settings of gpu.multiNode.nccl that are set; none by default), resources (the pod's, plus the
RDMA device where gpu.multiNode.rdma.enabled) and securityContext (the chart's, plus IPC_LOCK
where RDMA is enabled: RDMA registers, i.e. pins, its buffers past the memlock limit; empty
otherwise, so the chart's own applies unchanged).
*/}}
{{- define "atgrpo.trainerNetwork" -}}
{{- $m := .root.Values.gpu.multiNode -}}
{{- $env := list -}}
{{- $names := dict "socketIfname" "NCCL_SOCKET_IFNAME" "ibHca" "NCCL_IB_HCA" "netGdrLevel" "NCCL_NET_GDR_LEVEL" "ibGidIndex" "NCCL_IB_GID_INDEX" "debug" "NCCL_DEBUG" -}}
{{- range $key := keys $names | sortAlpha }}
{{- with index $m.nccl $key }}
{{- $env = append $env (dict "name" (index $names $key) "value" (toString .)) -}}
{{- end }}
{{- end }}
{{- $env = concat $env (default list $m.nccl.extraEnv) -}}
{{- $resources := deepCopy (default dict .resources) -}}
{{- $securityContext := dict -}}
{{- if $m.rdma.enabled }}
{{- $rdma := dict $m.rdma.resourceName (int $m.rdma.count) -}}
{{- $_ := set $resources "requests" (merge $rdma (default dict $resources.requests)) -}}
{{- $_ := set $resources "limits" (merge (deepCopy $rdma) (default dict $resources.limits)) -}}
{{- $securityContext = deepCopy .root.Values.securityContext -}}
{{- $caps := default dict $securityContext.capabilities -}}
{{- $_ := set $caps "add" (list "IPC_LOCK") -}}
{{- $_ := set $securityContext "capabilities" $caps -}}
{{- end }}
{{- toYaml (dict "env" $env "resources" $resources "securityContext" $securityContext) -}}
{{- end -}}
