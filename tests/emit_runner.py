"""Runs an emitted model.py with torch made unimportable: loads it, calls it on saved inputs."""
import sys

sys.modules["torch"] = None  # any `import torch` in the emitted module now fails

import importlib  # noqa: E402
import pickle  # noqa: E402

import jax  # noqa: E402
from flax import nnx  # noqa: E402


def main(out_dir: str, cases: str, results: str, eager: str = "") -> None:
    sys.path.insert(0, out_dir)
    model = importlib.import_module("model").load()
    assert isinstance(model, nnx.Module)
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))  # the emitted code must also jit
    with open(cases, "rb") as f:
        args_list = pickle.load(f)
    outs = [jax.tree.map(lambda v: jax.device_get(v), run(state, *args)) for args in args_list]
    if eager:  # and called directly (eagerly), numpy arrays in
        outs.append(jax.tree.map(jax.device_get, model(*args_list[0])))
    with open(results, "wb") as f:
        pickle.dump(outs, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
