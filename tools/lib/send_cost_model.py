"""The model ``tools.send_cost`` serves three times: it answers each request with its own inputs
(``in*`` as ``out*``), and config.pbtxt's parameter ``answer`` says how, as a Python model can
answer on stock Triton:

- ``return``: every response in the list ``execute`` returns (a plain model; one message back);
- ``send``: each through its request's response sender, inside ``execute`` (each a round trip);
- ``exit``: each handed to a thread that sends it after ``execute`` returned, which is how the
  pipeline's exit answers the queries that leave it (``backend/exit.py``).

Nothing of the dvabatch backend is on its path.
"""

import json
import queue
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.answer = config["parameters"]["answer"]["string_value"]
        self.sending: queue.SimpleQueue = queue.SimpleQueue()
        if self.answer == "exit":
            threading.Thread(target=self._send, daemon=True).start()

    def _send(self) -> None:
        while True:
            request, response = self.sending.get()
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests: list) -> list:
        returned = []
        for request in requests:
            tensors = [pb_utils.Tensor(t.name().replace("in", "out", 1), t.as_numpy().copy()) for t in request.inputs()]
            response = pb_utils.InferenceResponse(tensors)
            if self.answer == "return":
                returned.append(response)
                continue
            if self.answer == "send":
                request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.sending.put((request, response))
            returned.append(None)
        return returned
