"""Value gates (probe.models.gates) driven by given tensors, for the kernel tests: the models compute v_out and the
routing slot's key bias in PyTorch before the attention op, so the kernels are tested on what the gates produce."""

from types import SimpleNamespace

from probe.models.gates import GATES, apply_gate

# the gates that read only the value itself ("none": an ungated head)
TRANSFORMS = ("none", "silu", "tanh", "norm", "proj", "routing-norm")


def make_gate(kind, *, tau=None, w=None, b=None, beta=8.0):
    """The gate module ``kind`` whose parameters are the given tensors (leaves keep their identity for gradients)."""
    if kind == "none":
        return None
    hkv = next((t.shape[0] for t in (tau, w, b) if t is not None), 1)
    gate = GATES[kind](
        SimpleNamespace(
            n_kv_heads=hkv,
            d_value=1 if w is None else w.shape[-1],
            gate_tau_init=0.0,
            gate_beta=beta,
            init="fan-in",
            d_model=1,
        )
    )
    for name, t in (("tau", tau), ("w", w), ("b", b)):
        if name in gate._parameters:
            gate._parameters[name] = t  # the caller's tensor itself, so autograd reaches it
    return gate


def gated(kind, v, key_bias=None, **params):
    """(v_out, key_bias (B,Hkv,T) or None, the gate g or None) of ``kind`` on reads v (B,T,Hkv,dv)."""
    seen = []
    v_out, bias = apply_gate(make_gate(kind, **params), v, None, hook=lambda g: seen.append(g) or g)
    if key_bias is not None:
        bias = key_bias if bias is None else bias + key_bias.float()
    return v_out, bias, (seen[0] if seen else None)
