"""Runs emitted model.py files with torch made unimportable: loads each, calls it on saved inputs."""
import sys

sys.modules["torch"] = None  # any `import torch` in an emitted module now fails

import importlib.util  # noqa: E402
import pickle  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
from flax import nnx  # noqa: E402


def run_one(k: int, out_dir: str, args_list: list, eager: bool) -> list:
    # each emitted module is a file named model.py: load each under its own module name
    spec = importlib.util.spec_from_file_location(f"emitted_model_{k}", f"{out_dir}/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.load()
    assert isinstance(model, nnx.Module)
    if eager == "train":  # a train=True module: each call with its key (args, seed), then its statistics
        outs = [jax.tree.map(jax.device_get, model(*args, key=jax.random.key(seed))) for args, seed in args_list]
        stats = {".".join(map(str, p)): jax.device_get(v.get_raw_value())
                 for p, v in nnx.state(model, nnx.BatchStat).flat_state()}
        return outs + [stats]
    if eager == "padded":  # a padded module: called eagerly; then, for the first inputs, its `padded`
        # method under jax.jit, and the message of calling it (which cuts on the host) under jax.jit
        outs = [jax.tree.map(jax.device_get, model(*args)) for args in args_list]
        graphdef, state = nnx.split(model)
        padded = jax.jit(lambda s, *a: nnx.merge(graphdef, s).padded(*a))(state, *args_list[0])
        try:
            jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, *args_list[0])
            message = None
        except TypeError as exc:
            message = str(exc)
        return outs + [jax.device_get(padded), message]
    if eager == "only":  # a dispatch host's module: Python control flow between its jitted methods
        return [jax.tree.map(jax.device_get, model(*args)) for args in args_list]
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))  # the emitted code must also jit
    outs = [jax.tree.map(lambda v: jax.device_get(v), run(state, *args)) for args in args_list]
    if eager:  # and called directly (eagerly), numpy arrays in
        outs.append(jax.tree.map(jax.device_get, model(*args_list[0])))
    return outs


def main(jobs: str, results: str) -> None:
    """`jobs`: a pickle of {name: (emitted dir, input tuples, eager)}; `results`: {name: ("ok",
    outputs) or ("error", traceback)}, one job's failure not hiding the others' results."""
    with open(jobs, "rb") as f:
        todo = pickle.load(f)
    done = {}
    for k, (name, (out_dir, args_list, eager)) in enumerate(todo.items()):
        try:
            done[name] = ("ok", run_one(k, out_dir, args_list, eager))
        except Exception:  # noqa: BLE001  (reported to the test of this job)
            done[name] = ("error", traceback.format_exc())
    with open(results, "wb") as f:
        pickle.dump(done, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
