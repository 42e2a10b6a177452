"""Federated training and personalization on Flower (extra `federated`: pip install "edgetrain[federated]").

- client.py: the ClientApp, one device's round (its own data, checkpoint and personal layers);
- server.py: the ServerApp, FedAvg over named arrays from an artifact's initial parameters, a door that refuses
  mismatched replies, optional central differential privacy, the global model as a checkpoint and ONNX;
- deploy.py: a real Flower deployment on 127.0.0.1 (superlink, supernodes, `flwr run`), stopped on the way out;
- common.py: configuration keys, personal parameters, partitions of a dataset (no flwr needed);
- app/pyproject.toml: the Flower app that `flwr run` (on one machine or many) and `edgetrain federate` run.

Importing edgetrain does not import this package; the device side stays numpy-only without flwr.
"""
