"""A replica's full pushes arrive in memory an earlier push left (rollout_svc.weights.Staging):
the buffer of the push before last for an engine that adopts the pushed tensors, the last push's
own for one that copies them in; and the weights served are exactly the push's."""

import torch

from tests.rollout.served import GREEDY, HELLO, _perturbed, serve


def test_a_cpu_replica_receives_each_push_in_the_memory_the_one_before_last_left(tiny_model):
    """Pushes after the second arrive in memory already written (fresh pages fault in on the first
    write: most of a push's time on the replica), and the weights served are exactly the push."""

    async def go(c, engine):
        served = []
        for version in (1, 2, 3, 4):
            state = _perturbed(engine, seed=version)
            if engine.model.config.tie_word_embeddings:
                state["lm_head.weight"] = state["model.embed_tokens.weight"]
            await c.load_weights(state, "p", version)
            now = engine.model.state_dict()
            assert all(torch.equal(now[k], v) for k, v in state.items())
            served.append(now["model.norm.weight"].data_ptr())
            del now  # a view of the served weights would keep their memory from being reused
            after = await c.generate("p", messages=HELLO, sampling=GREEDY)
            assert after.policy.version == version
        assert served[2] == served[0] and served[3] == served[1] and served[0] != served[1]

    serve(tiny_model, go)


def test_a_push_an_engine_copies_in_leaves_its_memory_to_the_next_push(tiny_model, monkeypatch):
    """An engine that copies a push into its own weights (here bfloat16 bytes into a float32
    model, as a GPU engine copies onto its device) is done with the push's memory at once: the
    very next push arrives in it."""
    from rollout_svc.weights import TensorSink

    given, finish = [], TensorSink.finish

    def recorded(self):
        given.append(self.buffer.data_ptr())
        return finish(self)

    monkeypatch.setattr(TensorSink, "finish", recorded)

    async def go(c, engine):
        for version in (1, 2, 3):
            state = {k: v.bfloat16() for k, v in _perturbed(engine, seed=version).items()}
            if engine.model.config.tie_word_embeddings:
                state["lm_head.weight"] = state["model.embed_tokens.weight"]
            await c.load_weights(state, "p", version)
            now = engine.model.state_dict()
            assert now["model.norm.weight"].dtype == torch.float32
            assert all(torch.equal(now[k], v.float()) for k, v in state.items())

    serve(tiny_model, go)
    assert len(given) == 3 and given[0] == given[1] == given[2]
