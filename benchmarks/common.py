"""What the benchmarks share: the custom tiny-tier baseline, a random GPT-NeoX of pythia-160m's shape, and a peak-RSS
meter."""

from __future__ import annotations

import os
import threading
import time


def build(kind: str, seed: int = 0):
    """``"tiny"``: probe's tiny-tier baseline; otherwise pythia-160m's shape with random weights (probe's adapter)."""
    import torch

    torch.manual_seed(seed)
    if kind == "tiny":
        from probe.models import create

        return create("baseline", tier="tiny", seed=seed).eval()
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.adapters import adapt

    hf = AutoModelForCausalLM.from_config(pythia_160m_config(), attn_implementation="eager")
    return adapt(hf.eval(), name="pythia-160m-shape (random weights)")


def pythia_160m_config(max_positions: int = 2048):
    """pythia-160m's GPT-NeoX config (12 layers, width 768, 12 heads, rotary on 25%, vocab 50304)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=50304,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        rotary_pct=0.25,
        use_parallel_residual=True,
        attention_bias=True,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )


class PeakRSS:
    """Peak resident-set growth (bytes) over the RSS at entry, sampled by a background thread."""

    def __init__(self, interval: float = 0.001):
        self.interval, self.page = interval, os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self):
        self.start = self.peak = self.rss()
        self.running = True

        def sample():
            while self.running:
                self.peak = max(self.peak, self.rss())
                time.sleep(self.interval)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.rss())
        self.growth = self.peak - self.start
