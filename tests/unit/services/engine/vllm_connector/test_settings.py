"""The connector's settings from vLLM's kv_connector_extra_config."""
import pytest

from speckv.services.engine.vllm_connector.settings import ConnectorSettings


def test_peers_and_node_id_are_read_and_default_to_none():
    settings = ConnectorSettings.parse({"kvstore": "h:1", "peers": {"n2": "h:2"}, "node_id": "n1"})
    assert dict(settings.peers) == {"n2": "h:2"} and settings.node_id == "n1"
    assert dict(ConnectorSettings.parse({"kvstore": "h:1"}).peers) == {}


@pytest.mark.parametrize("peers", [["h:2"], {"n2": ""}, {"": "h:2"}, {"n2": 7}, "n2=h:2"])
def test_peers_that_are_not_a_map_of_node_to_address_are_refused(peers):
    with pytest.raises(ValueError, match="peers"):
        ConnectorSettings.parse({"kvstore": "h:1", "peers": peers})


def test_a_kvstore_is_required():
    with pytest.raises(ValueError, match="kvstore"):
        ConnectorSettings.parse({})


def test_loads_go_layer_by_layer_only_when_asked():
    assert ConnectorSettings.parse({"kvstore": "h:1"}).load_by_layer is False
    assert ConnectorSettings.parse({"kvstore": "h:1", "load_by_layer": True}).load_by_layer is True
    with pytest.raises(ValueError, match="load_by_layer"):
        ConnectorSettings.parse({"kvstore": "h:1", "load_by_layer": "no"})
