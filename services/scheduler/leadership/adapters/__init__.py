"""The leadership package's edge: etcd over HTTP (etcd3gw)."""
