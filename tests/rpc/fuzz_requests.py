"""What tests/rpc/test_rpc_fuzz.py sends the services: hints that mean something to them (names,
live episode ids, the served model), a valid request for every RPC that takes input, and the
strategies of one whole call built from those (random throughout, or a valid request with one
mistake in it)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable

import yaml
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from atgrpo._proto.v1 import (
    common_pb2,
    env_pb2,
    rollout_pb2,
    router_pb2,
    sandbox_pb2,
    trainer_pb2,
    trainer_pb2_grpc,
)
from tests.config.fuzz_configs import mutations, valid_config
from tests.rpc.fuzz_harness import RUN_ID, setup_request
from tests.rpc.fuzz_strategies import MessageStrategies, mutated, mutated_stream, texts


def _path_text() -> st.SearchStrategy[str]:
    """Directory names kept inside the scratch working directory."""
    return st.one_of(
        st.just(""),
        st.text(alphabet="abcdef-_0123456789", min_size=1, max_size=10).map(
            lambda s: f"fuzz-out/{s}"
        ),
    )


def hints(services) -> dict:
    episodes = [services.live_episode(env) for env in ("toy", "toy", "plan_path", "code")]
    weights = b"\x00" * 16
    return {
        "env": ["toy", "code", "math", "plan_path", "sokoban", "sudoku"],
        "split": ["train", "eval"],
        "task_id": ["0", "1", "7"],
        "agent": ["speaker", "listener", "coder", "tool", "plan"],
        "agents": ["speaker", "listener"],
        "turn_order": ["speaker", "listener"],
        "episode_id": episodes,
        "episode_ids": episodes,
        "pool": ["p"],
        "adapter": ["", "tool"],
        "run_id": [RUN_ID, "fuzz-run"],
        "language": ["python"],
        "code": ["print(1)", "print(input())", "import sys; sys.exit(3)", "raise SystemExit('x')"],
        "role": ["user", "system", "assistant"],
        "content": ["hello", "3"],
        "action_text": ["3", "```python\nprint(1)\n```"],
        "model_path": [services.model_dir, "no-such-model"],
        "dir": _path_text(),
        "checkpoint_dir": _path_text(),
        "resume_from": _path_text(),
        "rollout_addresses": [services.address("rollout")],
        "sha256": [hashlib.sha256(weights).hexdigest(), "0" * 64],
        "total_bytes": [16],
        "adapter_config_json": ['{"r": 4}', "{", "[]"],
        "device": ["cpu", "cuda", "auto"],
        "dtype": ["float32", "bfloat16", "auto"],
        "specialization": ["full", "lora"],
        "config_yaml": texts(["run: {name: x}", "{", "[]", "- 1"]),
    }


_STEPS = itertools.count(1000)


def valid_requests(services) -> dict[str, Callable[[], list]]:
    """A valid request (a list: one message, or a client stream) for every RPC that takes input;
    called per example, so ids and versions are current."""
    from atgrpo.contract import weight_payload as weights

    def episode() -> str:
        return services.live_episode()

    def train() -> list:
        version = (
            trainer_pb2_grpc.TrainerServiceStub(services.channel("trainer"))
            .GetInfo(common_pb2.GetInfoRequest(), timeout=30)
            .version
        )
        samples = [
            trainer_pb2.TrainSample(
                agent=agent,
                prompt_token_ids=[5, 9, 200 + i],
                response_token_ids=[7, 8],
                response_logprobs=[-1.0, -2.0],
                advantage=1.0 - i,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=4),
            )
            for i, agent in enumerate(["speaker", "listener"])
        ]
        header = trainer_pb2.TrainHeader(
            run_id=RUN_ID,
            step=next(_STEPS),
            pool="p",
            expected_version=version,
            num_samples=len(samples),
            update=trainer_pb2.UpdateParams(epochs=1),
        )
        return [
            trainer_pb2.TrainRequest(header=header),
            *(trainer_pb2.TrainRequest(sample=x) for x in samples),
        ]

    def load_weights() -> list:
        import torch  # a payload that parses, with names the served model does not have

        return weights.encode({"not.a.weight": torch.zeros(3)}, "p", 10**6, chunk_bytes=64)

    agents = [
        rollout_pb2.AgentRollout(name=a, pool="p", sampling=common_pb2.SamplingParams(max_tokens=3))
        for a in ("speaker", "listener")
    ]

    def generate() -> list:
        req = rollout_pb2.GenerateRequest(
            pool="p", n=2, sampling=common_pb2.SamplingParams(max_tokens=4)
        )
        req.messages.messages.add(role="user", content="hello")
        return [req]

    return {
        "env.Describe": lambda: [env_pb2.DescribeRequest(env="toy")],
        "env.ListTasks": lambda: [env_pb2.ListTasksRequest(env="code", split="train", limit=3)],
        "env.Reset": lambda: [env_pb2.ResetRequest(env="toy", task_id="0", seed=1, split="train")],
        "env.Observe": lambda: [env_pb2.ObserveRequest(episode_id=episode(), agent="speaker")],
        "env.Step": lambda: [
            env_pb2.StepRequest(episode_id=episode(), agent="speaker", action_text="3")
        ],
        "env.StepMany": lambda: [
            env_pb2.StepManyRequest(
                steps=[
                    env_pb2.StepRequest(episode_id=episode(), agent="speaker", action_text=t)
                    for t in ("3", "x")
                ]
            )
        ],
        "env.Fork": lambda: [env_pb2.ForkRequest(episode_id=episode(), n=2)],
        "env.Close": lambda: [env_pb2.CloseRequest(episode_ids=[episode()])],
        "sandbox.Execute": lambda: [
            sandbox_pb2.ExecuteRequest(language="python", code="print(input())", stdin=b"5")
        ],
        "sandbox.RunTests": lambda: [
            sandbox_pb2.RunTestsRequest(
                language="python",
                code="print(int(input()) * 2)",
                cases=[
                    sandbox_pb2.TestCase(stdin=b"2", expected_stdout=b"4"),
                    sandbox_pb2.TestCase(stdin=b"3", expected_stdout=b"7"),
                ],
            )
        ],
        "rollout.Generate": generate,
        "rollout.Collect": lambda: [
            rollout_pb2.CollectRequest(
                run_id="fuzz-collect",
                env="toy",
                tasks=[rollout_pb2.TaskRef(task_id="0", seed=1, split="train", episode=1)],
                agents=agents,
                turn_order=["speaker", "listener"],
                max_turns=2,
                k=2,
            )
        ],
        "rollout.LoadWeights": load_weights,
        "router.WatchRun": lambda: [router_pb2.WatchRunRequest(run_id="fuzz-run")],
        "router.StopRun": lambda: [router_pb2.StopRunRequest(run_id="fuzz-run")],
        "router.GetRun": lambda: [router_pb2.GetRunRequest(run_id="fuzz-run")],
        "trainer.Setup": lambda: [setup_request(services.model_dir, [services.address("rollout")])],
        "trainer.Train": train,
        "trainer.SaveCheckpoint": lambda: [trainer_pb2.SaveCheckpointRequest(dir="fuzz-out/ckpt")],
        # the folder SaveCheckpoint's examples write; any other is refused (FAILED_PRECONDITION)
        "trainer.DeleteCheckpoint": lambda: [
            trainer_pb2.DeleteCheckpointRequest(dir="fuzz-out/ckpt")
        ],
    }


def request_lists(gen: MessageStrategies, rpc_id: str, method, services) -> st.SearchStrategy[list]:
    """What one call sends: one message, or for a client stream a list of them. Half the
    examples are random throughout, half are a valid request with one mistake in it."""
    valid = valid_requests(services).get(rpc_id)
    one_mistake = None
    if valid is not None:
        base = st.builds(valid)
        if method.client_streaming:
            one_mistake = base.flatmap(lambda msgs: mutated_stream(msgs, gen))
        else:
            one_mistake = base.flatmap(lambda msgs: mutated(msgs[0], gen).map(lambda m: [m]))
    one = gen.for_message(method.input_type)
    if rpc_id == "router.StartRun":
        base = valid_config(
            services={
                "env": services.address("env"),
                "sandbox": services.address("sandbox"),
                "router": services.address("router"),
                "rollout": {"shared": [services.address("rollout")]},
                "trainer": {"shared": services.address("trainer")},
            }
        )
        base["pools"]["shared"]["model_path"] = services.model_dir
        yaml_text = st.one_of(
            mutations(base).map(lambda m: yaml.safe_dump(m[0])), st.just(yaml.safe_dump(base))
        )
        one = st.one_of(one, yaml_text.map(lambda t: router_pb2.StartRunRequest(config_yaml=t)))
    if not method.client_streaming:
        random = one.map(lambda m: [m])
        return random if one_mistake is None else st.one_of(random, one_mistake)
    # Streams: anything in any order, or the expected shape (a header, then parts) with random
    # content.
    cls = GetMessageClass(method.input_type)
    part_names = [f.name for f in method.input_type.oneofs[0].fields]
    header, rest = part_names[0], part_names[1]
    header_msgs = gen.for_message(method.input_type.fields_by_name[header].message_type).map(
        lambda h: cls(**{header: h})
    )
    rest_field = method.input_type.fields_by_name[rest]
    if rest_field.message_type is not None:
        rest_msgs = gen.for_message(rest_field.message_type).map(lambda r: cls(**{rest: r}))
    else:
        rest_msgs = st.binary(max_size=64).map(lambda b: cls(**{rest: b}))
    shaped = st.tuples(header_msgs, st.lists(rest_msgs, max_size=4)).map(lambda t: [t[0], *t[1]])
    return st.one_of(
        st.lists(one, max_size=4), shaped, *([one_mistake] if one_mistake is not None else [])
    )
