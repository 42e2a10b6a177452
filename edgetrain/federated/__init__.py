"""Federated training and personalization on Flower (extra `federated`: pip install "edgetrain[federated]").

- client.py: the ClientApp, one device's round (its own data, checkpoint and personal layers);
- server.py: the ServerApp, FedAvg or a robust rule (Flower's median, trimmed mean, Krum, Bulyan) over named
  arrays from an artifact's initial parameters, a door that refuses every reply that is not an honest update
  (and skips a round with too few), optional central differential privacy, the global model as a checkpoint and
  ONNX;
- privacy.py: SecAgg+ and local differential privacy (Flower's), on Flower's older message path, both sides;
- deploy.py: a real Flower deployment on 127.0.0.1 (superlink, supernodes, `flwr run`), stopped on the way out;
- simulation.py: the same apps on Flower's simulation engine (Ray): thousands of simulated devices on one machine;
- common.py: configuration keys, personal parameters, partitions of a dataset (no flwr needed);
- wire.py: a reply's arrays decoded from their bytes and checked against the global model, for the door (no flwr);
- app/pyproject.toml: the Flower app that `flwr run` (on one machine or many) and `edgetrain federate` run.

Importing edgetrain does not import this package; the device side stays numpy-only without flwr.
"""
