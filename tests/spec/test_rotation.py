"""The rotation contract (pyq2.spec.rotation) and the numpy references of the rotation
(pyq2.spec.reference), without a GPU: the transform against the explicit Sylvester matrix, folding,
the gdn_v_grouped permutation against its index formula, and every refusal of a contract pyq2 does
not understand."""

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.spec import formats, reference
from pyq2.spec.rotation import PREFIX, Rotation, contract_keys


class KV(dict):
    def value(self, key, default=None):
        return self.get(key, default)


def contract(**changes):
    signs = {256: np.ones(256, np.int8), 512: -np.ones(512, np.int8)}
    kv = KV(
        contract_keys(128, signs, ["blk.0.ffn_down.weight", "output.weight"], ["token_embd.weight"])
    )
    for k, v in changes.items():
        if v is None:
            kv.pop(PREFIX + k, None)
        else:
            kv[PREFIX + k] = v
    return kv


@pytest.mark.parametrize("block", [1, 2, 4, 8, 64, 256])
def test_fwht_is_the_normalised_sylvester_matrix(block):
    x = np.random.default_rng(block).standard_normal((3, 4 * block))
    h = reference.sylvester(block) / np.sqrt(block)
    want = (x.reshape(3, 4, block) @ h.T).reshape(3, -1)
    assert np.allclose(reference.fwht(x, block), want, atol=1e-12)
    assert np.allclose(h @ h, np.eye(block))  # orthonormal and symmetric: its own inverse


def test_rotate_inverse_and_fold():
    r = np.random.default_rng(7)
    s = r.choice([-1, 1], 512)
    x = r.standard_normal((4, 512))
    assert np.allclose(reference.rotate(reference.rotate(x, 128, s), 128, s, inverse=True), x)
    w = r.standard_normal((9, 512))
    wf = reference.fold(w, 128, s)  # W' = W diag(s) H
    h = np.kron(np.eye(4), reference.sylvester(128) / np.sqrt(128))
    assert np.allclose(wf, w @ np.diag(s) @ h)
    assert np.allclose(wf @ reference.rotate(x, 128, s).T, w @ x.T)
    assert np.allclose(reference.unfold(wf, 128, s), w)


def test_gdn_v_grouped_index_formula():
    hd, nk, rep = 4, 3, 2
    nv, width = nk * rep, hd * nk * rep
    x = np.arange(width) * 10
    y = reference.gdn_v_grouped(x, nv, nk)
    for d in range(hd):
        for k in range(nk):
            for r in range(rep):
                assert y[d + hd * (r + rep * k)] == x[d + hd * (k + nk * r)]


def test_contract_reads_and_checks_widths():
    rot = Rotation.from_file(contract(), {"blk.0.ffn_down.weight": 512, "output.weight": 256})
    assert rot.block == 128 and rot.sign_mode == "explicit" and rot.folds("output.weight")
    assert rot.signs_for(512).dtype == np.int8 and (rot.signs_for(512) == -1).all()
    assert rot.inverse_weight_names == ("token_embd.weight",)
    assert Rotation.from_file(KV()) is None  # no contract: no rotation
    ident = Rotation.from_file(contract(sign_mode="identity", sign_widths=None, sign_values=None))
    assert ident.signs_for(5120) is None


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"version": 3}, "version 3"),
        ({"transform": "dct"}, "transform 'dct'"),
        ({"axis": "output"}, "axis 'output'"),
        ({"sign_mode": "random"}, "sign_mode 'random'"),
        ({"block_size": 96}, "block_size 96"),
        ({"block_size": 8192}, "block_size 8192"),
        ({"block_size": 32}, "block_size 32"),
        ({"sign_widths": [256, 500]}, "sign width 500"),
        ({"sign_values": [1] * 700}, "holds 700 values"),
        ({"sign_values": [1] * 767 + [2]}, "sign_values[767] = 2"),
        ({"version": "1"}, "version = '1' is not a int"),
        ({"block_size": None}, "block_size is missing"),
        ({"sign_widths": None}, "sign_widths is missing"),
        ({"sign_values": [float("nan")] * 768}, "sign_values holds non-integer values"),
        ({"sign_widths": ["256", 512]}, "sign_widths holds non-integer values"),
        ({"sign_widths": [256.0, 512]}, "sign_widths holds non-integer values"),
    ],
)
def test_contract_refusals(changes, words):
    with pytest.raises(FormatError) as e:
        Rotation.from_file(contract(**changes))
    assert words in str(e.value)


def test_folded_weight_without_signs_for_its_width():
    with pytest.raises(FormatError) as e:
        Rotation.from_file(contract(), {"blk.0.ffn_down.weight": 768})
    assert "'blk.0.ffn_down.weight' has input width 768" in str(e.value)


def test_q8_of_rotated_activations_against_the_unfolded_weights():
    """The folding contract on the CPU: Q8 of rotate(x) times the folded PQ2_0 weights is x times
    the unfolded float weights, within the Q8 error (the GPU test does the same on the GPU)."""
    r = np.random.default_rng(11)
    n, k, block = 64, 1024, 256
    s = r.choice([-1, 1], k)
    raw = formats.pq2_quantize(reference.fold(r.standard_normal((n, k)), block, s))
    w = reference.unfold(formats.pq2_dequantize(raw, n, k), block, s)
    x = r.standard_normal((3, k))
    y = reference.matmul_q8(raw, n, k, reference.rotate(x, block, s).astype(np.float32))
    assert reference.rel_rms(y, x @ w.T) < 1e-2
