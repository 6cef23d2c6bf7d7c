{{/*
Names. The release part is cut to 30 characters so that "<fullname>-rollout-<pool>" (pool names
have at most 12, values.schema.json) stays within the 52 characters a StatefulSet name may have:
its pods' controller-revision-hash label adds 11 more and labels stop at 63.
*/}}
{{- define "atgrpo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 30 | trimSuffix "-" -}}
{{- end -}}

{{- define "atgrpo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>[-<pool>]": the name of a component's workload and Service. */}}
{{- define "atgrpo.componentName" -}}
{{- $base := printf "%s-%s" (include "atgrpo.fullname" .root) .component -}}
{{- if .pool }}{{ printf "%s-%s" $base .pool }}{{ else }}{{ $base }}{{ end -}}
{{- end -}}

{{- define "atgrpo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: immutable once a workload exists, so no version or chart label here. */}}
{{- define "atgrpo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "atgrpo.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .pool }}
atgrpo.dev/pool: {{ .pool }}
{{- end }}
{{- end -}}

{{- define "atgrpo.labels" -}}
{{ include "atgrpo.selectorLabels" . }}
helm.sh/chart: {{ include "atgrpo.chart" .root }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: atgrpo
{{- end -}}

{{/* Labels on objects that belong to no one component (ConfigMaps, monitoring). */}}
{{- define "atgrpo.commonLabels" -}}
app.kubernetes.io/name: {{ include "atgrpo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ include "atgrpo.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: atgrpo
{{- end -}}

{{- define "atgrpo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "atgrpo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference: [registry/]repository:tag[@digest]; the tag defaults to appVersion.
Registry "local" means none: the images are on the nodes already (validate.yaml refuses ""). */}}
{{- define "atgrpo.image" -}}
{{- $img := index .root.Values.images .kind -}}
{{- $repo := $img.repository -}}
{{- $registry := .root.Values.images.registry -}}
{{- if and $registry (ne $registry "local") }}{{ $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo }}{{ end -}}
{{- $ref := printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag) -}}
{{- with $img.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* In-cluster DNS names. */}}
{{- define "atgrpo.svcHost" -}}
{{- printf "%s.%s.svc.%s" (include "atgrpo.componentName" .) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{- define "atgrpo.address" -}}
{{- printf "%s:%d" (include "atgrpo.svcHost" .) (int .root.Values.ports.grpc) -}}
{{- end -}}

{{/* Per-pod addresses of a StatefulSet behind its headless Service: <sts>-<i>.<svc>.<ns>.svc.<domain>:<port>,
one line each. Stable across restarts, so they can be written into the run config. */}}
{{- define "atgrpo.podAddresses" -}}
{{- $name := include "atgrpo.componentName" . -}}
{{- $host := include "atgrpo.svcHost" . -}}
{{- range $i := until (int .replicas) }}
{{ printf "%s-%d.%s:%d" $name $i $host (int $.root.Values.ports.grpc) }}
{{- end }}
{{- end -}}

{{/* dict: root, pool (name), replicas */}}
{{- define "atgrpo.rolloutAddresses" -}}
{{- include "atgrpo.podAddresses" (dict "root" .root "component" "rollout" "pool" .pool "replicas" .replicas) -}}
{{- end -}}

{{/* dict: root, pool (name), gpus. A trainer past one node is its Service's name, which lists
its leader pod (global rank 0) alone. */}}
{{- define "atgrpo.trainerAddress" -}}
{{- $ctx := dict "root" .root "component" "trainer" "pool" .pool -}}
{{- if gt (include "atgrpo.trainerNodeCount" (dict "root" .root "gpus" (int .gpus) "poolName" .pool) | int) 1 }}
{{- include "atgrpo.address" $ctx -}}
{{- else }}
{{- include "atgrpo.podAddresses" (merge (dict "replicas" 1) $ctx) | trim -}}
{{- end }}
{{- end -}}

{{/* Deep merge of .src into .dst (in place). Unlike sprig's mergeOverwrite, a false, 0 or empty
value in .src wins: a pool's `trainable: false` or `gpus: 0` must override poolDefaults. */}}
{{- define "atgrpo.merge" -}}
{{- range $key, $src := .src }}
{{- $dst := index $.dst $key }}
{{- if and (kindIs "map" $src) (kindIs "map" $dst) }}
{{- include "atgrpo.merge" (dict "dst" $dst "src" $src) }}
{{- else }}
{{- $_ := set $.dst $key $src }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The pools, each poolDefaults overridden by its own values; no pools = one pool "main".
Use as: $pools := include "atgrpo.pools" . | fromYaml */}}
{{- define "atgrpo.pools" -}}
{{- $out := dict -}}
{{- range $name, $pool := (default (dict "main" (dict)) .Values.pools) }}
{{- $merged := deepCopy $.Values.poolDefaults }}
{{- include "atgrpo.merge" (dict "dst" $merged "src" (default dict $pool)) }}
{{- $_ := set $out $name $merged }}
{{- end }}
{{- toYaml $out -}}
{{- end -}}

{{/* How many agents of the run config generate with pool .pool: those of env.turn_order whose
agents.<a>.pool is it, or that name no pool when it is the only one (RunConfig.agents_of). A LoRA
pool's vLLM engine keeps one adapter slot for each. */}}
{{- define "atgrpo.poolAgents" -}}
{{- $cfg := include "atgrpo.runConfig" .root | fromYaml -}}
{{- $only := eq (len (include "atgrpo.pools" .root | fromYaml)) 1 -}}
{{- $n := 0 -}}
{{- range $a := (default list (default dict $cfg.env).turn_order) }}
{{- $p := default "" (default dict (index (default dict $cfg.agents) $a)).pool -}}
{{- if or (eq $p $.pool) (and (eq $p "") $only) }}{{ $n = add1 $n }}{{ end -}}
{{- end }}
{{- $n -}}
{{- end -}}

{{/* The smallest adapter rank vLLM can start with (vllm/config/lora.py MaxLoRARanks) that holds
the pool's config.lora.rank (atgrpo/plan.py vllm_lora_limits); over 512 `atgrpo config check` refuses. */}}
{{- define "atgrpo.vllmLoraRank" -}}
{{- $rank := int (dig "config" "lora" "rank" 16 .) -}}
{{- $out := 512 -}}
{{- range $r := list 512 320 256 128 64 32 16 8 1 }}{{ if ge (int $r) $rank }}{{ $out = $r }}{{ end }}{{ end -}}
{{- $out -}}
{{- end -}}

{{/* The context (tokens) pool .pool's engines need: the longest max_prompt_tokens + max_tokens of
the run config's agents on it, train or eval sampling, with atgrpo/config.py's SamplingConfig
defaults (2048 + 256); 0 when no agent uses it. As RunConfig.context_tokens computes it. */}}
{{- define "atgrpo.poolContext" -}}
{{- $cfg := include "atgrpo.runConfig" .root | fromYaml -}}
{{- $need := 0 -}}
{{- range $name, $agent := default dict $cfg.agents }}
{{- if eq (default "" $agent.pool) $.pool }}
{{- range $which := list "train_sampling" "eval_sampling" }}
{{- $s := default dict (index $agent $which) -}}
{{- $n := add (int (default 2048 $s.max_prompt_tokens)) (int (default 256 $s.max_tokens)) -}}
{{- if gt (int $n) $need }}{{ $need = int $n }}{{ end -}}
{{- end }}
{{- end }}
{{- end }}
{{- $need -}}
{{- end -}}

{{/* The device a pool's processes use: cuda when its rollout pods get GPUs (validate.yaml makes a
trainable pool's trainer agree; a frozen pool has no trainer). */}}
{{- define "atgrpo.poolDevice" -}}
{{- if gt (int .rollout.gpus) 0 }}cuda{{ else }}cpu{{ end -}}
{{- end -}}

{{/* Flags every service takes (atgrpo/rpc/main.py). */}}
{{- define "atgrpo.serverArgs" -}}
- --host={{ .Values.listenHost }}
- --port={{ .Values.ports.grpc }}
- --metrics-port={{ .Values.ports.metrics }}
- --log-level={{ .Values.logLevel }}
{{- if .Values.security.tlsSecret }}
- --health-port={{ .Values.ports.health }}
{{- end }}
{{- end -}}

{{/* Where the security Secrets are mounted, in every pod that has them. */}}
{{- define "atgrpo.tlsDir" -}}/etc/atgrpo/tls{{- end -}}
{{- define "atgrpo.tokenDir" -}}/etc/atgrpo/token{{- end -}}

{{/* The Secret holding the token: security.tokenSecret, else the chart's own <fullname>-token
(secret-token.yaml) unless security.generateToken is false; "" = no token at all. */}}
{{- define "atgrpo.tokenSecretName" -}}
{{- if .Values.security.tokenSecret -}}
{{- .Values.security.tokenSecret -}}
{{- else if .Values.security.generateToken -}}
{{- printf "%s-token" (include "atgrpo.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The environment atgrpo.rpc.security reads, servers and clients alike (a list; may be empty).
Every process of the release is both: the services call each other, the run Job calls them all. */}}
{{- define "atgrpo.securityEnv" -}}
{{- $sec := .Values.security -}}
{{- $tls := include "atgrpo.tlsDir" . -}}
{{- $env := list -}}
{{- if $sec.tlsSecret -}}
{{- $env = concat $env (list
      (dict "name" "ATGRPO_TLS_SERVER_CERT" "value" (printf "%s/tls.crt" $tls))
      (dict "name" "ATGRPO_TLS_SERVER_KEY" "value" (printf "%s/tls.key" $tls))
      (dict "name" "ATGRPO_TLS_CA" "value" (printf "%s/ca.crt" $tls))
      (dict "name" "ATGRPO_TLS_SERVER_NAME" "value" $sec.serverName)) -}}
{{- if $sec.mutualTLS -}}
{{- $env = concat $env (list
      (dict "name" "ATGRPO_TLS_CLIENT_CA" "value" (printf "%s/ca.crt" $tls))
      (dict "name" "ATGRPO_TLS_CERT" "value" (printf "%s/tls.crt" $tls))
      (dict "name" "ATGRPO_TLS_KEY" "value" (printf "%s/tls.key" $tls))) -}}
{{- end -}}
{{- end -}}
{{- if include "atgrpo.tokenSecretName" . -}}
{{- $env = append $env (dict "name" "ATGRPO_AUTH_TOKEN_FILE" "value" (printf "%s/token" (include "atgrpo.tokenDir" .))) -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/* The Secret volumes and their mounts (dicts with "volumes" and "mounts" lists). */}}
{{- define "atgrpo.securityVolumes" -}}
{{- $sec := .Values.security -}}
{{- $volumes := list -}}
{{- $mounts := list -}}
{{- if $sec.tlsSecret -}}
{{- $volumes = append $volumes (dict "name" "atgrpo-tls" "secret" (dict "secretName" $sec.tlsSecret "defaultMode" 288)) -}}
{{- $mounts = append $mounts (dict "name" "atgrpo-tls" "mountPath" (include "atgrpo.tlsDir" .) "readOnly" true) -}}
{{- end -}}
{{- $token := include "atgrpo.tokenSecretName" . -}}
{{- if $token -}}
{{- $volumes = append $volumes (dict "name" "atgrpo-token" "secret" (dict "secretName" $token "defaultMode" 288
      "items" (list (dict "key" "token" "path" "token")))) -}}
{{- $mounts = append $mounts (dict "name" "atgrpo-token" "mountPath" (include "atgrpo.tokenDir" .) "readOnly" true) -}}
{{- end -}}
{{- toYaml (dict "volumes" $volumes "mounts" $mounts) -}}
{{- end -}}

{{/* A Kubernetes quantity ("40Gi", "512Mi", "1.5G", 1073741824) in bytes, printed as a float;
"" when it is not one. */}}
{{- define "atgrpo.bytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?" $q -}}
{{- $units := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0
      "Ei" 1152921504606846976.0 "k" 1000.0 "K" 1000.0 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "m" 0.001 -}}
{{- $unit := trimPrefix $num $q -}}
{{- if and $num (hasKey $units $unit) }}{{ mulf (float64 $num) (index $units $unit) }}{{ end -}}
{{- end -}}

{{/* Fails unless the pod's ephemeral-storage limit (its containers' added up, as the kubelet
counts it) covers what its disk-backed emptyDirs may hold (their size limits added up): else the
kubelet evicts the pod before they fill. dict: where (the values path), resources, disks (a list
of dicts: name, size). */}}
{{- define "atgrpo.checkEphemeral" -}}
{{- $limit := (default dict .resources.limits) | dig "ephemeral-storage" "" -}}
{{- $fail := "atgrpo: invalid values:" -}}
{{- if not $limit }}
{{- fail (printf "%s %s.resources.limits.ephemeral-storage: not set, so the pod could fill its node's disk. Set it to at least what its emptyDirs may hold (%s) plus ~1Gi for logs" $fail .where (include "atgrpo.diskList" .disks)) }}
{{- end }}
{{- $limitBytes := include "atgrpo.bytes" $limit -}}
{{- if not $limitBytes }}
{{- fail (printf "%s %s.resources.limits.ephemeral-storage: %q is not a Kubernetes quantity. Write e.g. 2Gi" $fail .where (toString $limit)) }}
{{- end }}
{{- $sum := 0.0 -}}
{{- range .disks }}{{ $sum = addf $sum (float64 (include "atgrpo.bytes" .size)) }}{{ end -}}
{{- if lt (float64 $limitBytes) $sum }}
{{- fail (printf "%s %s.resources.limits.ephemeral-storage: %s is below what the pod's emptyDirs may hold, %s = %.1fGi, so the kubelet would evict the pod before they fill. Raise it to at least %.0fGi (logs count too), or lower the sizes" $fail .where (toString $limit) (include "atgrpo.diskList" .disks) (divf $sum 1073741824.0) (ceil (addf (divf $sum 1073741824.0) 1.0))) }}
{{- end }}
{{- end -}}

{{- define "atgrpo.diskList" -}}
{{- $parts := list -}}
{{- range . }}{{ $parts = append $parts (printf "%s %s" .name (toString .size)) }}{{ end -}}
{{- join " + " $parts -}}
{{- end -}}

{{/*
A pod spec. Arguments (a dict):
  root, component, pool (optional), image (cpu | rollout | trainer, or imageRef: a full reference),
  command (optional list), args (list), resources, where (the values path of resources and tmpSize,
  for messages), tmpSize (the /tmp emptyDir's size limit), gpus, nodeSelector, tolerations,
  affinity, server (true: gRPC ports and probes), startup (true: a startup probe for slow imports
  before listening), volumes, mounts, initContainers, podSecurityContext, securityContext,
  hostUsers, runtimeClassName, restartPolicy, env,
  noToken (true: without the token, for a pod that neither serves a token-guarded RPC nor calls one).
*/}}
{{- define "atgrpo.podSpec" -}}
{{- $v := .root.Values -}}
{{- $secEnv := include "atgrpo.securityEnv" .root | fromYamlArray -}}
{{- $secVolumes := include "atgrpo.securityVolumes" .root | fromYaml -}}
{{- if .noToken }}
{{- $keep := dict "env" list "volumes" list "mounts" list -}}
{{- range $secEnv }}{{ if ne .name "ATGRPO_AUTH_TOKEN_FILE" }}{{ $_ := set $keep "env" (append $keep.env .) }}{{ end }}{{ end -}}
{{- range $k := list "volumes" "mounts" }}{{ range index $secVolumes $k }}{{ if ne .name "atgrpo-token" }}{{ $_ := set $keep $k (append (index $keep $k) .) }}{{ end }}{{ end }}{{ end -}}
{{- $secEnv = $keep.env -}}
{{- $secVolumes = $keep -}}
{{- end }}
{{- $gpus := int (default 0 .gpus) -}}
{{- $tmpSize := default "1Gi" .tmpSize -}}
{{- $disks := list (dict "name" "/tmp" "size" $tmpSize) -}}
{{- range .volumes }}
{{- if hasKey . "emptyDir" }}
{{- $e := default dict .emptyDir -}}
{{- if ne (default "" $e.medium) "Memory" }}
{{- $disks = append $disks (dict "name" .name "size" (required (printf "atgrpo: invalid values: volume %s of %s: an emptyDir without sizeLimit could fill its node's disk. Give it one, e.g. {emptyDir: {sizeLimit: 50Gi}}" .name (default $.component $.where)) $e.sizeLimit)) -}}
{{- end }}
{{- end }}
{{- end }}
{{- include "atgrpo.checkEphemeral" (dict "where" (default .component .where) "resources" (default dict .resources) "disks" $disks) -}}
serviceAccountName: {{ include "atgrpo.serviceAccountName" .root }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .restartPolicy }}
restartPolicy: {{ . }}
{{- end }}
{{- with .terminationGracePeriodSeconds }}
terminationGracePeriodSeconds: {{ . }}
{{- end }}
{{- if hasKey . "hostUsers" }}
hostUsers: {{ .hostUsers }}
{{- end }}
{{- with .runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.images.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml (default $v.podSecurityContext .podSecurityContext) | nindent 2 }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $tolerations := default list .tolerations -}}
{{- if gt $gpus 0 }}{{ $tolerations = concat $tolerations $v.gpu.tolerations }}{{ end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .initContainers }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .component }}
    image: {{ .imageRef | default (include "atgrpo.image" (dict "root" .root "kind" .image)) }}
    imagePullPolicy: {{ $v.images.pullPolicy }}
    {{- with .command }}
    command:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with .args }}
    args:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    env:
      - name: HOME
        value: /tmp
      - name: ATGRPO_LOG_LEVEL
        value: {{ $v.logLevel | quote }}
      - name: POD_NAME
        valueFrom:
          fieldRef:
            fieldPath: metadata.name
      {{- with $secEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with .env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if .server }}
    ports:
      - name: grpc
        containerPort: {{ $v.ports.grpc }}
        protocol: TCP
      - name: metrics
        containerPort: {{ $v.ports.metrics }}
        protocol: TCP
      {{- if $v.security.tlsSecret }}
      - name: health
        containerPort: {{ $v.ports.health }}
        protocol: TCP
      {{- end }}
      {{- with .extraPorts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- /* Native gRPC probes (grpc.health.v1). Readiness asks for service "" (the server as a
    whole): SERVING once the service is built (a rollout replica: its models loaded), NOT_SERVING
    while it loads and on SIGTERM, so a loading pod gets no traffic. Startup and liveness ask for
    service "liveness", SERVING from the moment the process listens: a load of any length is
    never killed, a process whose event loop stops answering is. They cannot speak TLS: with TLS
    on they ask the plaintext health-only port (--health-port). */}}
    {{- $probePort := ternary $v.ports.health $v.ports.grpc (not (empty $v.security.tlsSecret)) }}
    {{- if .startup }}
    startupProbe:
      grpc:
        port: {{ $probePort }}
        service: liveness
      {{- toYaml $v.probes.startup | nindent 6 }}
    {{- end }}
    livenessProbe:
      grpc:
        port: {{ $probePort }}
        service: liveness
      {{- toYaml $v.probes.liveness | nindent 6 }}
    readinessProbe:
      grpc:
        port: {{ $probePort }}
      {{- toYaml $v.probes.readiness | nindent 6 }}
    {{- end }}
    {{- $resources := deepCopy (default dict .resources) -}}
    {{- if gt $gpus 0 }}
    {{- $_ := set $resources "requests" (merge (dict $v.gpu.resourceName $gpus) (default dict $resources.requests)) }}
    {{- $_ := set $resources "limits" (merge (dict $v.gpu.resourceName $gpus) (default dict $resources.limits)) }}
    {{- end }}
    {{- with $resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- toYaml (default $v.securityContext .securityContext) | nindent 6 }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      {{- with $secVolumes.mounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with .mounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: {{ $tmpSize }}
  {{- with $secVolumes.volumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .volumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* A PodDisruptionBudget for one component (dict: root, component, pool, pdb). */}}
{{- define "atgrpo.pdb" -}}
{{- if and .root.Values.podDisruptionBudget.enabled .pdb }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "atgrpo.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "atgrpo.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The Service in front of a component; headless ones give each pod its own DNS record. */}}
{{- define "atgrpo.service" -}}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "atgrpo.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" . | nindent 4 }}
    atgrpo.dev/metrics: "true"
spec:
  {{- if .headless }}
  clusterIP: None
  {{- /* Only ready replicas get DNS records, so resolving the Service name lists the replicas
  that can take work (atgrpo/discovery.py). */}}
  publishNotReadyAddresses: false
  {{- else }}
  type: ClusterIP
  {{- end }}
  selector:
    {{- include "atgrpo.selectorLabels" . | nindent 4 }}
    {{- if .leaderOnly }}
    {{- /* a trainer past one node: only its leader pod (global rank 0) serves */}}
    leaderworkerset.sigs.k8s.io/worker-index: "0"
    {{- end }}
  ports:
    - name: grpc
      port: {{ .root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ .root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
    {{- with .extraPorts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* An init container that builds the tiny CPU model into a pool's model path (models.buildTiny). */}}
{{- define "atgrpo.buildTinyInit" -}}
- name: build-tiny-model
  image: {{ include "atgrpo.image" (dict "root" .root "kind" "cpu") }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  args: [atgrpo, model, tiny, --out, {{ .modelPath | quote }}]
  env:
    - name: HOME
      value: /tmp
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 500m, memory: 1Gi, ephemeral-storage: 256Mi}
    limits: {memory: 2Gi, ephemeral-storage: 1Gi}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: models
      mountPath: {{ .root.Values.models.mountPath }}
{{- end -}}

{{/*
The two data stores, models (rollout and trainer pods) and datasets (env pods): each an existing
claim, any volume source, or a claim the chart creates, optionally filled by a populate Job.
dict: root, store (models | datasets).
*/}}

{{/* The volume source (a map without name; empty when the store has none), read-only or not. */}}
{{- define "atgrpo.storeSource" -}}
{{- $s := index .root.Values .store -}}
{{- $readOnly := true -}}
{{- if hasKey . "readOnly" }}{{ $readOnly = .readOnly }}{{ end -}}
{{- if and (eq .store "models") $s.buildTiny }}
{{- toYaml (dict "emptyDir" (dict "sizeLimit" "1Gi")) }}
{{- else if $s.create.enabled }}
{{- toYaml (dict "persistentVolumeClaim" (dict "claimName" (include "atgrpo.componentName" (dict "root" .root "component" .store)) "readOnly" $readOnly)) }}
{{- else if $s.volume }}
{{- toYaml $s.volume }}
{{- else if $s.existingClaim }}
{{- toYaml (dict "persistentVolumeClaim" (dict "claimName" $s.existingClaim "readOnly" $readOnly)) }}
{{- end }}
{{- end -}}

{{/* Whether a populate Job fills the store ("true" or ""). */}}
{{- define "atgrpo.storePopulated" -}}
{{- $s := index .root.Values .store -}}
{{- if and $s.populate.enabled (not (and (eq .store "models") $s.buildTiny)) }}true{{ end -}}
{{- end -}}

{{/* Hash of what the populate Job puts on the volume: the name of the file it writes last, which the
pods wait for. A change of downloads, command or volume is a new file, so the pods wait again. */}}
{{- define "atgrpo.populateMarker" -}}
{{- $s := index .root.Values .store -}}
{{- $what := dict "downloads" $s.populate.downloads "command" $s.populate.command "image" $s.populate.image
      "mountPath" $s.mountPath "source" (include "atgrpo.storeSource" (dict "root" .root "store" .store "readOnly" false)) -}}
{{- printf "%s/.atgrpo-populated-%s" (trimSuffix "/" $s.mountPath) (toYaml $what | sha256sum | trunc 8) -}}
{{- end -}}

{{/* The volume and mount of a store, for pods that read it (read-only). */}}
{{- define "atgrpo.storeVolume" -}}
{{- $source := include "atgrpo.storeSource" . | fromYaml -}}
{{- if $source }}
- {{ toYaml (merge (dict "name" .store) $source) | nindent 2 | trim }}
{{- end }}
{{- end -}}

{{- define "atgrpo.storeMount" -}}
{{- $s := index .root.Values .store -}}
- name: {{ .store }}
  mountPath: {{ $s.mountPath }}
  readOnly: {{ not (and (eq .store "models") $s.buildTiny) }}
{{- end -}}

{{/* An init container that waits until the store's populate Job has finished, then checks that
the paths the pod reads are there. dict: root, store, image (cpu | rollout | trainer), paths. */}}
{{- define "atgrpo.storeWaitInit" -}}
{{- $s := index .root.Values .store -}}
{{- $marker := include "atgrpo.populateMarker" . -}}
{{- $jobs := printf "kubectl -n %s get jobs -l app.kubernetes.io/instance=%s,app.kubernetes.io/component=%s" .root.Release.Namespace .root.Release.Name .store -}}
{{- $paths := list -}}
{{- range .paths }}{{ $paths = append $paths (squote .) }}{{ end -}}
{{- $script := printf `n=0
until [ -e %s ]; do
  if [ $((n %% 20)) -eq 0 ]; then echo "waiting for the %s populate Job to fill %s (%s)"; fi
  n=$((n + 1)); sleep 15
done
missing=0
for p in %s; do
  if [ ! -e "$p" ]; then echo "the %s populate Job has finished, but $p is not on the volume: check %s.populate" >&2; missing=1; fi
done
exit $missing` (squote $marker) .store $s.mountPath $jobs (join " " $paths) .store .store -}}
- name: wait-for-{{ .store }}
  image: {{ include "atgrpo.image" (dict "root" .root "kind" .image) }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  command: [/bin/sh, -c, {{ $script | quote }}]
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 32Mi, ephemeral-storage: 64Mi}
    limits: {memory: 128Mi, ephemeral-storage: 256Mi}
  volumeMounts:
    {{- include "atgrpo.storeMount" . | nindent 4 }}
{{- end -}}

{{/* The models volume of rollout and trainer pods. */}}
{{- define "atgrpo.modelsVolume" -}}
{{- include "atgrpo.storeVolume" (dict "root" . "store" "models") -}}
{{- end -}}

{{- define "atgrpo.modelsMount" -}}
{{- include "atgrpo.storeMount" (dict "root" . "store" "models") -}}
{{- end -}}

{{/* The init containers of a pool's rollout or trainer pod: the tiny model's build, or the wait
for the models' populate Job. dict: root, pool (merged values), image. */}}
{{- define "atgrpo.modelsInit" -}}
{{- if .root.Values.models.buildTiny }}
{{- include "atgrpo.buildTinyInit" (dict "root" .root "modelPath" .pool.modelPath) }}
{{- else if include "atgrpo.storePopulated" (dict "root" .root "store" "models") }}
{{- include "atgrpo.storeWaitInit" (dict "root" .root "store" "models" "image" .image
      "paths" (list (printf "%s/config.json" (trimSuffix "/" .pool.modelPath)))) }}
{{- end }}
{{- end -}}

{{/* The dataset files env_svc reads: the math and code envs' path options (env_svc/datasets.py
sources: options.path, overridden by train.path and eval.path; the built-in `sample` set reads
none). A list of dicts: where (the values path), path. */}}
{{- define "atgrpo.datasetPaths" -}}
{{- $env := default dict (default dict .Values.run.config).env -}}
{{- $out := list -}}
{{- if has (toString $env.name) (list "math" "code") }}
{{- $opts := default dict $env.options -}}
{{- range $split := list "train" "eval" }}
{{- $per := index $opts $split | default dict -}}
{{- $dataset := lower (toString (default (default "sample" $opts.dataset) $per.dataset)) -}}
{{- $path := toString (default (default "" $opts.path) $per.path) -}}
{{- $where := ternary (printf "run.config.env.options.%s.path" $split) "run.config.env.options.path" (hasKey $per "path") -}}
{{- if and $path (ne $dataset "sample") }}
{{- $out = append $out (dict "where" $where "path" $path) -}}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $out -}}
{{- end -}}

{{/* Scheduling for a pool's component: the component's own setting, else the pool's. */}}
{{- define "atgrpo.poolScheduling" -}}
{{- $out := dict -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" -}}
{{- $_ := set $out $key (default (index $.pool $key) (index $.part $key)) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
