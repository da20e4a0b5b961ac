"""Triton's entry point for every model whose config.pbtxt says ``backend: "dvabatch"``.

Only Triton glue lives here: requests become ``Query`` objects answered from their own response
senders, and ``execute`` returns None at once, so Triton can hand over the next batch while
earlier ones are still running (Triton 24.06+ allows this in the default, non-decoupled mode).
"""

import importlib
import json
import sys
from pathlib import Path

import triton_python_backend_utils as pb_utils

# Triton's stub imports this file as a top-level module. Import the folder it lives in as a
# package, whatever it is called (backend/ in the repository, dvabatch/ in a Triton install),
# so the runtime modules beside this file can use relative imports.
if not __package__:
    _HERE = Path(__file__).resolve().parent
    sys.path.insert(0, str(_HERE.parent))
    importlib.import_module(_HERE.name)
    __package__ = _HERE.name

from .config import RuntimeConfig, triton_parameters  # noqa: E402
from .device import make_device  # noqa: E402
from .engine import load_engines  # noqa: E402
from .manifest import Manifest  # noqa: E402
from .query import Query  # noqa: E402
from .runtime import Runtime  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self._manifest = Manifest.load(version_dir)
        config = json.loads(args["model_config"])
        if config.get("max_batch_size", 0) > self._manifest.max_batch_size:
            raise ValueError(
                f"max_batch_size {config['max_batch_size']} in config.pbtxt exceeds the "
                f"{self._manifest.max_batch_size} the model was sliced for"
            )
        runtime_config = RuntimeConfig.from_parameters(triton_parameters(config))
        device = make_device(args.get("model_instance_kind", "CPU"), int(args.get("model_instance_device_id", 0)))
        engines = load_engines(self._manifest, version_dir, device)
        self._runtime = Runtime(self._manifest, engines, runtime_config, device)

    def execute(self, requests: list) -> None:
        self._runtime.submit([self._query(request) for request in requests])
        return None

    def finalize(self) -> None:
        self._runtime.close()

    def _query(self, request) -> Query:
        inputs = {}
        for spec in self._manifest.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is not None:
                # Copy out of Triton's shared memory: the batch runs after execute() returns.
                inputs[spec.name] = tensor.as_numpy().copy()
        sender = request.get_response_sender()

        def respond(outputs, failure):
            if failure is not None:
                code = pb_utils.TritonError.INVALID_ARG if failure.bad_input else pb_utils.TritonError.INTERNAL
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(failure.message, code))
            else:
                response = pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in outputs.items()])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        return Query(inputs=inputs, respond=respond, requested_outputs=tuple(request.requested_output_names()))
