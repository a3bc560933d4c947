import numpy as np
import pytest

from nibble_testing import fresh_seed


@pytest.fixture
def rng():
    """A numpy Generator with a fresh seed, printed (shown when the test fails)."""
    return np.random.default_rng(fresh_seed())
