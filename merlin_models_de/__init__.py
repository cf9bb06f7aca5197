"""merlin_models_de: model-parallel embedding tables for Merlin Models."""
__version__ = "0.1.0"
