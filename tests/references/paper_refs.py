"""Independent references for the paper's code listings (zoo/paper/*.pen).

Hand-written from the paper's equations (graphical-design-paper, sections 2.2–5) in plain torch
(matmul, broadcasting, sums), without penrose and without copying the listings' einsum strings.
Each function takes the parameters by their diagram names in a dict `P` and the inputs by
their diagram names, accepts any leading batch dimensions, and returns the diagram's outputs
in the order of its `output` statement (a tensor when there is one output, else a tuple).

Index legend (as in the diagrams):
    i, j, k   operations table: vector element / matrix legs
    b sample  d latent feature   k concept   s concept state   e embedding
    p prototype (or key token)   t token     r task / vocabulary   m memory slot
    f MLP hidden                 u unknown concept
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


# ---- section 2.2: the operations table --------------------------------------------------------


def _unit(x: Tensor, dim: int = -1) -> Tensor:
    """x / ||x|| along dim."""
    return x / torch.sqrt((x * x).sum(dim, keepdim=True))


def operations(P, *, v, w, a, b, A, B):
    h_scalar = v * w                                   # h = a b (scalars)
    h_dot = (a * b).sum(-1)                            # h = sum_i a_i b_i
    h_elementwise = a * b                              # h_i = a_i b_i
    h_squared_norm = (a * a).sum(-1)                   # h = ||a||^2
    an = _unit(a)                                      # a_i / sqrt(sum_j a_j^2)
    bn = _unit(b)
    h_cosine = (an * bn).sum(-1)                       # sum_i an_i bn_i
    h_convex = (a * torch.softmax(b, -1)).sum(-1)      # sum_i a_i p_i, p = softmax(b)
    h_slice_sum = B.sum(-1)                            # h_i = sum_k B_ik
    h_matvec = (A * b.unsqueeze(-1)).sum(-2)           # h_j = sum_i A_ij b_i
    h_scaled = A * b.unsqueeze(-1)                     # H_ij = A_ij b_i
    H_matmat = A.transpose(-1, -2) @ B                 # H_jk = sum_i A_ij B_ik
    return (h_scalar, h_dot, h_elementwise, h_squared_norm, an, h_cosine, h_convex,
            h_slice_sum, h_matvec, h_scaled, H_matmat)


# ---- section 3: simple neural models ----------------------------------------------------------


def linear_model(P, *, x):
    # y_i = sigma(sum_j W_ij x_j)
    return torch.sigmoid(x @ P["W"].T)


def mlp(P, *, X):
    # Y_bi = sigma(sum W^(L) ... sigma(sum_j W^(0)_ij X_bj))
    z = X
    for name in ("W0", "W1", "WL"):
        z = torch.sigmoid(z @ P[name].T)
    return z


def self_attention(P, *, Z):
    q = Z @ P["W_q"]                                   # q_te = sum_d Z_td Wq_de
    k = Z @ P["W_k"]
    v = Z @ P["W_v"]
    e = q.shape[-1]
    l = (q @ k.transpose(-1, -2)) / math.sqrt(e)       # l_tp = sum_e q_te k_pe / sqrt(e)
    probs = torch.softmax(l, dim=-1)                   # softmax over key tokens p
    return probs @ v                                   # h_te = sum_p probs_tp v_pe


# ---- section 4.1: concept encoding maps --------------------------------------------------------


def sparse_encoder(P, *, z):
    # c_k = sigma(sum_d W_dk z_d)
    return torch.sigmoid(z @ P["W"])


def concept_bottleneck(P, *, z):
    # c_k = sigma(sum_d W_dk z_d)
    return torch.sigmoid(z @ P["W"])


def concept_embedding_bottleneck(P, *, z):
    W = P["W"]                                         # [d, k, s, e]
    zz = z.reshape(*z.shape, 1, 1, 1)                  # [..., d, 1, 1, 1]
    u = (zz * W).sum(-4)                               # u_kse = sum_d W_dkse z_d
    c = torch.sigmoid((u * P["S"]).sum(-1))            # c_ks = sigma(sum_e u_kse S_e)
    return c, u


def prototype_concept_map(P, *, z):
    zn = _unit(z)                                      # normalised embedding
    Pn = _unit(P["P"], dim=0)                          # each prototype P[:, p, k] normalised over d
    d = z.shape[-1]
    l = (zn @ Pn.reshape(d, -1)).reshape(*z.shape[:-1], *Pn.shape[1:])  # l_pk = sum_d Pn_dpk zn_d
    probs = torch.softmax(l, dim=-2)                   # probs_pk = softmax over prototypes p
    return (probs * P["p_true"]).sum(-2)               # c_k = sum_p probs_pk pi_pk


# ---- section 4.2: concept composition maps -----------------------------------------------------


def neural_additive_model(P, *, c):
    h1 = torch.sigmoid(c[..., :, None, None] * P["W1"])          # h1_kri = sigma(c_k W1_kri)
    h2 = torch.sigmoid((h1.unsqueeze(-1) * P["W2"]).sum(-2))     # h2_krj = sigma(sum_i h1_kri W2_krij)
    hL = (h2 * P["WL"]).sum(-1)                                  # hL_kr = sum_e h2_kre WL_kre
    return torch.sigmoid(hL.sum(-2))                             # y_r = sigma(sum_k hL_kr)


def concept_embedding_predictor(P, *, u, c):
    h = u * c.unsqueeze(-1)                            # h_kse = u_kse c_ks
    h = h.sum(-2)                                      # h_ke = sum_s h_kse
    W = P["W"]                                         # [k, e, r]
    l = h.flatten(-2) @ W.reshape(-1, W.shape[-1])     # l_r = sum_ke h_ke W_ker
    return torch.sigmoid(l)


def mixture_of_linear_models(P, *, z, c):
    l = z @ P["W"]                                     # l_m = sum_d W_dm z_d
    pr = torch.softmax(l, dim=-1)                      # pr_m = softmax over slots m
    v = (c[..., :, None, None] * P["E"]).sum(-3)       # v_mr = sum_k E_kmr c_k
    ly = (pr.unsqueeze(-1) * v).sum(-2)                # l_r = sum_m v_mr pr_m
    return torch.sigmoid(ly)


# ---- section 5: the Steerling-8B listing -------------------------------------------------------


def _layer_norm(x: Tensor, eps: float = 1e-5) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def _keep_top(x: Tensor, k: int) -> Tensor:
    """Zero all but the k largest entries of the last leg (ties are not expected)."""
    kth = torch.sort(x, dim=-1, descending=True).values[..., k - 1 : k]
    return x * (x >= kth).to(x.dtype)


def steerling_listing(P, *, X, k_known: int = 4, k_unknown: int = 3):
    Z = X @ P["E"] + X @ P["Ep"]                       # 0) token + position encodings
    q = Z @ P["W_q"]                                   # 1) q, k, v
    k = Z @ P["W_k"]
    v = Z @ P["W_v"]
    l = (q @ k.transpose(-1, -2)) / math.sqrt(P["W_k"].shape[1])   # 2)
    n = l.shape[-1]
    visible = torch.ones(n, n, dtype=torch.bool, device=l.device).tril()
    l = l.masked_fill(~visible, float("-inf"))         # 3) causal mask
    probs = torch.softmax(l, dim=-1)                   # 4)
    h = probs @ v                                      # 5)
    Z = Z + h @ P["W"]                                 # 6) projection (dropout off)
    h = torch.sigmoid(_layer_norm(Z) @ P["W1"]) @ P["W2"]          # 7) MLP
    Z = Z + h
    cs = torch.sigmoid(Z @ P["Ws"])                    # 8) known concepts
    cu = torch.sigmoid(Z.detach() @ P["Wu"])           #    unknown concepts (no gradient into Z)
    csf = _keep_top(cs, k_known)                       # 9) top-k
    cuf = _keep_top(cu, k_unknown)
    ce = csf @ P["Ks"] + cuf @ P["Ku"]                 # 10), 11)
    Z = Z - ce                                         # 12) residual
    Z = Z + ce                                         # 13) concepts back
    y = torch.sigmoid(Z @ P["Wh"])                     # 14) linear head
    return y, csf, cuf
