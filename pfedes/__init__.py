"""pfedes: personalized federated learning across heterogeneous devices on Flower."""

__version__ = "0.1.0"
