"""Ditto on the server: FedAvg's weighted average of the global model. Evaluation messages
carry no arrays: each client reports its personal model v, which never leaves it."""

from .base import PersonalizedStrategy


class Ditto(PersonalizedStrategy):
    send_arrays_to_evaluate = False
