"""The model zoo: what each device runs, and the shared proxy extractor."""

from .proxy import ProxyExtractor
from .zoo import ARCHITECTURES, ClientModel, build_client_model, resolve_architecture

__all__ = ["ARCHITECTURES", "ClientModel", "ProxyExtractor", "build_client_model",
           "resolve_architecture"]
