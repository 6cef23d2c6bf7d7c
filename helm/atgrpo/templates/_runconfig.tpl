{{/*
The run config the Job trains with (atgrpo/config.py): values.run.config, plus
  - agents: every agent of env.turn_order, on the only pool when it names none;
  - pools: from values.pools (model path, engine, device from the GPUs, replicas, rollout GPUs and
    memory fraction, trainable, the trainer's GPUs) and
    their `config` extras (lora, optim, micro_batch_tokens);
  - services: the in-cluster addresses of this release's Services and per-pod StatefulSet names;
  - run.run_dir under dataMountPath, so trainers checkpoint onto their volumes.
*/}}
{{- define "atgrpo.runConfig" -}}
{{- $v := .Values -}}
{{- $cfg := deepCopy (default dict $v.run.config) -}}
{{- $run := default dict $cfg.run -}}
{{- if not $run.run_dir }}
{{- $_ := set $run "run_dir" (printf "%s/runs/%s" (trimSuffix "/" $v.dataMountPath) (default "run" $run.name)) -}}
{{- end }}
{{- $_ := set $cfg "run" $run -}}
{{- $allPools := include "atgrpo.pools" . | fromYaml -}}
{{- $poolNames := keys $allPools | sortAlpha -}}
{{- $agents := default dict $cfg.agents -}}
{{- $envCfg := default dict $cfg.env -}}
{{- range $name := default list $envCfg.turn_order }}
{{- if not (hasKey $agents $name) }}{{ $_ := set $agents $name dict }}{{ end -}}
{{- end }}
{{- range $name, $agent := $agents }}
{{- $a := default dict $agent -}}
{{- if and (not $a.pool) (eq (len $poolNames) 1) }}{{ $_ := set $a "pool" (first $poolNames) }}{{ end -}}
{{- $_ := set $agents $name $a -}}
{{- end }}
{{- $_ := set $cfg "agents" $agents -}}
{{- $pools := dict -}}
{{- range $name, $pool := $allPools }}
{{- $p := deepCopy (default dict $pool.config) -}}
{{- $_ := set $p "model_path" $pool.modelPath -}}
{{- $_ := set $p "specialization" $pool.specialization -}}
{{- $_ := set $p "engine" $pool.engine -}}
{{- $_ := set $p "device" (include "atgrpo.poolDevice" $pool) -}}
{{- $_ := set $p "dtype" $pool.dtype -}}
{{- $_ := set $p "rollout_replicas" (int $pool.rollout.replicas) -}}
{{- if gt (int $pool.rollout.gpus) 0 }}{{ $_ := set $p "rollout_gpus" (int $pool.rollout.gpus) }}{{ end -}}
{{- with $pool.rollout.gpuMemoryUtilization }}{{ $_ := set $p "rollout_gpu_memory_utilization" . }}{{ end -}}
{{- $_ := set $p "trainable" (ne $pool.trainable false) -}}
{{- /* the ranks its trainer starts (0 GPUs: one CPU rank), so `atgrpo plan` on this config and
the run's own check plan what runs */ -}}
{{- if ne $pool.trainable false }}{{ $_ := set $p "trainer_gpus" (max 1 (int $pool.trainer.gpus)) }}{{ end -}}
{{- $_ := set $pools $name $p -}}
{{- end }}
{{- $_ := set $cfg "pools" $pools -}}
{{- $rollout := dict -}}
{{- $trainer := dict -}}
{{- range $name, $pool := $allPools }}
{{- /* The pool's headless Service: its DNS name lists every ready replica, so one that joins
(a scaled StatefulSet) is synced and given work, and one that leaves is dropped (router_svc/fleet.py). */ -}}
{{- $_ := set $rollout $name (list (printf "dns:///%s" (include "atgrpo.address" (dict "root" $ "component" "rollout" "pool" $name)))) -}}
{{- if ne $pool.trainable false }}
{{- $_ := set $trainer $name (include "atgrpo.trainerAddress" (dict "root" $ "pool" $name "gpus" $pool.trainer.gpus)) -}}
{{- end }}
{{- end }}
{{- $_ := set $cfg "services" (dict
      "router" (include "atgrpo.address" (dict "root" . "component" "router"))
      "env" (include "atgrpo.address" (dict "root" . "component" "env"))
      "sandbox" (include "atgrpo.address" (dict "root" . "component" "sandbox"))
      "rollout" $rollout "trainer" $trainer) -}}
{{- /* Go writes small floats as 1e-06, which YAML 1.1 (PyYAML) reads as a string: add the ".0". */ -}}
{{- regexReplaceAll "(?m)([:-] )(-?[0-9]+)([eE][-+][0-9]+)$" (toYaml $cfg) "${1}${2}.0${3}" -}}
{{- end -}}

{{/* `--address KIND=HOST:PORT` for every service and replica of the release, for `atgrpo status`. */}}
{{- define "atgrpo.statusArgs" -}}
{{- $targets := list (printf "router=%s" (include "atgrpo.address" (dict "root" . "component" "router")))
      (printf "env=%s" (include "atgrpo.address" (dict "root" . "component" "env")))
      (printf "sandbox=%s" (include "atgrpo.address" (dict "root" . "component" "sandbox"))) -}}
{{- range $pool, $p := include "atgrpo.pools" . | fromYaml }}
{{- /* an autoscaled pool runs at least minReplicas: those are checked */ -}}
{{- $auto := default dict $p.rollout.autoscale -}}
{{- $count := ternary $p.rollout.replicas (default 1 $auto.minReplicas) (eq (default "off" $auto.mode) "off") -}}
{{- range $a := include "atgrpo.rolloutAddresses" (dict "root" $ "pool" $pool "replicas" $count) | trim | splitList "\n" }}
{{- $targets = append $targets (printf "rollout=%s" $a) -}}
{{- end }}
{{- if ne $p.trainable false }}
{{- $targets = append $targets (printf "trainer=%s" (include "atgrpo.trainerAddress" (dict "root" $ "pool" $pool "gpus" $p.trainer.gpus))) -}}
{{- end }}
{{- end }}
{{- range $targets }}
- --address
- {{ . }}
{{- end }}
{{- end -}}
