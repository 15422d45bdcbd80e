# source lab/dev.sh on the device: wheels, paths, library
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD
export PYQ2_LIBRARY=$PWD/build/dev-gpu/libpq2.so
export PQ2_COMMIT=$(cat lab/commit 2>/dev/null || echo unknown)
