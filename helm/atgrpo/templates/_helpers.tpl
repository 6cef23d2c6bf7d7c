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

{{/* An image reference: [registry/]repository:tag[@digest]; the tag defaults to appVersion. */}}
{{- define "atgrpo.image" -}}
{{- $img := index .root.Values.images .kind -}}
{{- $repo := $img.repository -}}
{{- with .root.Values.images.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
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

{{- define "atgrpo.trainerAddress" -}}
{{- include "atgrpo.podAddresses" (dict "root" .root "component" "trainer" "pool" .pool "replicas" 1) | trim -}}
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

{{/*
A pod spec. Arguments (a dict):
  root, component, pool (optional), image (cpu | rollout | trainer), args (list),
  resources, gpus, nodeSelector, tolerations, affinity, server (true: gRPC ports and probes),
  startup (true: a startup probe for slow imports before listening), volumes, mounts, initContainers,
  podSecurityContext, securityContext, hostUsers, runtimeClassName, restartPolicy, env,
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
serviceAccountName: {{ include "atgrpo.serviceAccountName" .root }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .restartPolicy }}
restartPolicy: {{ . }}
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
    image: {{ include "atgrpo.image" (dict "root" .root "kind" .image) }}
    imagePullPolicy: {{ $v.images.pullPolicy }}
    args:
      {{- toYaml .args | nindent 6 }}
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
    emptyDir: {}
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
    requests: {cpu: 500m, memory: 1Gi}
    limits: {memory: 2Gi}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: models
      mountPath: {{ .root.Values.models.mountPath }}
{{- end -}}

{{/* The models volume: the user's volume source, or an emptyDir the init container fills. */}}
{{- define "atgrpo.modelsVolume" -}}
- name: models
  {{- if .Values.models.buildTiny }}
  emptyDir: {}
  {{- else if .Values.models.volume }}
  {{- toYaml .Values.models.volume | nindent 2 }}
  {{- else }}
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim }}
    readOnly: true
  {{- end }}
{{- end -}}

{{- define "atgrpo.modelsMount" -}}
- name: models
  mountPath: {{ .Values.models.mountPath }}
  readOnly: {{ not .Values.models.buildTiny }}
{{- end -}}

{{/* Scheduling for a pool's component: the component's own setting, else the pool's. */}}
{{- define "atgrpo.poolScheduling" -}}
{{- $out := dict -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" -}}
{{- $_ := set $out $key (default (index $.pool $key) (index $.part $key)) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
