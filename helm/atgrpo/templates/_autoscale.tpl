{{/* A pool's rollout autoscaler (pools.<pool>.rollout.autoscale): a HorizontalPodAutoscaler
(autoscaling/v2) on a per-pod metric the Prometheus adapter serves, or a KEDA ScaledObject with a
Prometheus trigger. The metrics:

  busy   each replica's engine busy fraction, rate(atgrpo_rollout_busy_seconds_total[1m]) (0-1):
         the share of time it spends generating or loading weights
  queue  each replica's requests waiting for its engine, atgrpo_rollout_requests_waiting

The router follows whatever count results: a new replica is synced with the current weights
before it gets work, a removed one drains (drainSeconds) and its unfinished tasks go elsewhere. */}}
{{- define "atgrpo.rolloutAutoscaler" -}}
{{- $a := .auto -}}
{{- $name := include "atgrpo.componentName" .ctx -}}
{{- $where := printf "pools.%s.rollout.autoscale" .pool -}}
{{- if ne .mode "off" }}
{{- $min := int (default 1 $a.minReplicas) -}}
{{- $max := int (required (printf "atgrpo: invalid values: %s.maxReplicas is not set: give the most replicas the pool may run" $where) $a.maxReplicas) -}}
{{- if or (lt $min 1) (lt $max $min) }}
{{- fail (printf "atgrpo: invalid values: %s: minReplicas %d, maxReplicas %d: need 1 <= minReplicas <= maxReplicas" $where $min $max) }}
{{- end }}
{{- $metric := default "busy" $a.metric -}}
{{- $series := dict "busy" "atgrpo_rollout_busy_fraction" "queue" "atgrpo_rollout_requests_waiting" -}}
{{- if not (hasKey $series $metric) }}
{{- fail (printf "atgrpo: invalid values: %s.metric %q: use busy (engine busy fraction) or queue (requests waiting)" $where $metric) }}
{{- end }}
{{- $target := required (printf "atgrpo: invalid values: %s.target is not set: e.g. 0.8 for busy, 4 for queue" $where) $a.target -}}
---
{{- if eq .mode "hpa" }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" .ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: StatefulSet
    name: {{ $name }}
  minReplicas: {{ $min }}
  maxReplicas: {{ $max }}
  metrics:
    - type: Pods
      pods:
        # served by the Prometheus adapter (docs/deploy.md, "Autoscaling rollout replicas")
        metric:
          name: {{ index $series $metric }}
        target:
          type: AverageValue
          averageValue: {{ $target | quote }}
  behavior:
    scaleDown:
      # a replica costs a model load to bring back: shrink only after a lull
      stabilizationWindowSeconds: {{ int (default 300 $a.scaleDownWindowSeconds) }}
{{- else if eq .mode "keda" }}
{{- if not (.root.Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject") }}
{{- fail (printf "atgrpo: invalid values: %s.mode keda, but this cluster has no KEDA (keda.sh/v1alpha1 ScaledObject). Install KEDA, or use mode hpa with the Prometheus adapter" $where) }}
{{- end }}
{{- $sel := printf "namespace=%q, pod=~%q" .root.Release.Namespace (printf "%s-[0-9]+" $name) -}}
{{- $query := ternary (printf "sum(rate(atgrpo_rollout_busy_seconds_total{%s}[1m]))" $sel) (printf "sum(atgrpo_rollout_requests_waiting{%s})" $sel) (eq $metric "busy") -}}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "atgrpo.labels" .ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: StatefulSet
    name: {{ $name }}
  minReplicaCount: {{ $min }}
  maxReplicaCount: {{ $max }}
  cooldownPeriod: {{ int (default 300 $a.scaleDownWindowSeconds) }}
  triggers:
    - type: prometheus
      metadata:
        serverAddress: {{ required (printf "atgrpo: invalid values: %s.prometheusAddress is not set: the Prometheus KEDA queries, e.g. http://prometheus-operated.monitoring.svc:9090" $where) $a.prometheusAddress | quote }}
        # the pool's total; KEDA runs ceil(total / threshold) replicas
        query: {{ $query | quote }}
        threshold: {{ $target | quote }}
{{- else }}
{{- fail (printf "atgrpo: invalid values: %s.mode %q: use off, hpa or keda" $where .mode) }}
{{- end }}
{{- end }}
{{- end -}}
