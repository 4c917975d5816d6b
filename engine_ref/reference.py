"""The dense reference: one request at a time, no cache, everything recomputed per token.

It shares the model's weights and nothing else: its own embedding lookup, RoPE application,
causal softmax attention over the full sequence and MLP, written plainly (a mixture of
experts: every expert on every token, weighted by the router's top-k, zero elsewhere).
The paged, batched, chunked, cached, preempted engine must produce the same greedy tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .model import LlamaModel, rope_inv_freq


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return w * (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _swiglu(y: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(y, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def _moe(y: torch.Tensor, mlp) -> torch.Tensor:
    """A Qwen2-MoE block, densely: all experts on all tokens [t, E, h], then weighted."""
    logits = F.linear(y, mlp.gate.weight)
    if mlp.router_bias is not None:
        logits = logits + mlp.router_bias.to(logits.dtype)
    probs = logits.float().softmax(-1)
    top, idx = probs.topk(mlp.top_k, dim=-1)
    if mlp.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, idx, top).to(y.dtype)  # [t, E]
    gate_up, down = mlp.experts.gate_up_proj, mlp.experts.down_proj
    gate, up = torch.einsum("th,eih->tei", y, gate_up).chunk(2, dim=-1)
    out = torch.einsum("tei,ehi->teh", F.silu(gate) * up, down)
    x = (out * weights[..., None]).sum(1)
    if mlp.shared_expert is not None:
        s = mlp.shared_expert
        shared = _swiglu(y, s.gate_up_proj.weight, s.down_proj.weight)
        x = x + torch.sigmoid(F.linear(y, mlp.shared_expert_gate.weight)) * shared
    return x


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class ReferenceOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    min_margin: float  # smallest top-1 minus top-2 logit gap over the greedy choices


class DenseReference:
    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.cfg = model.config

    @torch.no_grad()
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """fp32 logits [T, vocab] for every position of `token_ids`."""
        m, cfg = self.model, self.cfg
        dev, dtype = m.embed_tokens.weight.device, m.embed_tokens.weight.dtype
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=dev)
        t, h, hk, d = len(ids), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x = m.embed_tokens.weight[ids]
        freqs = torch.arange(t, device=dev).float()[:, None] * rope_inv_freq(cfg).to(dev)[None, :]
        cos = torch.cat((freqs, freqs), -1).cos().to(dtype)[:, None, :]
        sin = torch.cat((freqs, freqs), -1).sin().to(dtype)[:, None, :]
        causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        for layer in m.layers:
            a = layer.self_attn
            y = _rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
            qkv = F.linear(y, a.qkv_proj.weight, a.qkv_proj.bias)
            q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
            q = _rope(q.view(t, h, d), cos, sin).transpose(0, 1)  # [h, t, d]
            k = _rope(k.view(t, hk, d), cos, sin).transpose(0, 1)
            v = v.view(t, hk, d).transpose(0, 1)
            k = k.repeat_interleave(h // hk, dim=0)
            v = v.repeat_interleave(h // hk, dim=0)
            scores = (q.float() @ k.float().transpose(1, 2)) / d**0.5
            probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            o = (probs @ v.float()).to(dtype).transpose(0, 1).reshape(t, h * d)
            x = x + F.linear(o, a.o_proj.weight, a.o_proj.bias)
            y = _rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
            if cfg.is_moe:
                x = x + _moe(y, layer.mlp)
            else:
                x = x + _swiglu(y, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
        x = _rms(x, m.norm.weight, cfg.rms_norm_eps)
        return F.linear(x, m.lm_head_weight).float()

    def greedy(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        max_model_len: int | None = None,
    ) -> ReferenceOutput:
        """Greedy decoding with the engine's stop rules, recomputing everything per token."""
        max_len = max_model_len or self.cfg.max_position_embeddings
        seq = list(prompt)
        out: list[int] = []
        lps: list[float] = []
        margin = float("inf")
        while True:
            last = self.logits(seq)[-1]
            top2 = last.topk(2).values
            margin = min(margin, float(top2[0] - top2[1]))
            tok = int(last.argmax())
            out.append(tok)
            lps.append(float(last.log_softmax(-1)[tok]))
            seq.append(tok)
            if (not ignore_eos and tok in eos_token_ids) or tok in stop_token_ids:
                return ReferenceOutput(out, lps, "stop", margin)
            if len(out) >= max_tokens or len(seq) >= max_len:
                return ReferenceOutput(out, lps, "length", margin)
