"""What SpeckvConnector tells vLLM before any instance exists."""
from speckv.services.engine.vllm_connector.connector import SpeckvConnector


def test_layer_by_layer_loads_ask_vllm_for_piecewise_cuda_graphs():
    # A full graph's replay skips wait_for_layer_load: the attention would read pages not yet written.
    assert SpeckvConnector.requires_piecewise_for_cudagraph({"kvstore": "h:1", "load_by_layer": True})
    assert not SpeckvConnector.requires_piecewise_for_cudagraph({"kvstore": "h:1"})
    assert not SpeckvConnector.requires_piecewise_for_cudagraph({"kvstore": "h:1", "load_by_layer": False})
