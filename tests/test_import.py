import subprocess
import sys


def test_import_is_light():
    """`import linrnn` works without a GPU and imports no Triton code."""
    code = (
        "import sys, linrnn; linrnn.build_model('gdn');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or m.startswith('linrnn.kernels.triton')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
