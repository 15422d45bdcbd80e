"""pyq2.gguf.weights' scale check: the one every reader runs on a weight's raw PQ2_0 rows."""

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.gguf.weights import check_scales
from pyq2.spec import formats as F


def test_check_scales():
    codes = np.ones((6, 128), np.uint8)
    d = np.ones(6, np.float16)
    check_scales(F.pq2_pack(codes, d).reshape(-1), 3, "w", 0)
    d[4] = np.inf
    with pytest.raises(FormatError, match=r"^tensor 'w': row 1, block 1 has scale inf .*0x7c00"):
        check_scales(F.pq2_pack(codes, d).reshape(-1), 3, "w", 0)
    d[5] = np.nan
    # rows 10.. of the weight, groups 6.. of each row: named within the whole row
    with pytest.raises(FormatError, match=r"row 11, block 7 has scale inf .*2 non-finite scales"):
        check_scales(F.pq2_pack(codes, d).reshape(-1), 3, "w", 10, 6)
