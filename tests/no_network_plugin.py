"""A STAND-IN for a machine without a network (the lent TPU: no TCP socket, not even loopback), as a
pytest plugin: every AF_INET/AF_INET6 bind fails. ``python -m pytest -p no_network_plugin ...`` with
tests/ on the path; tests/test_accel_support.py uses it to check the loopback skips."""

import socket

_bind = socket.socket.bind


def _refuse(self, addr):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise PermissionError(1, "Operation not permitted (stand-in: no network)")
    return _bind(self, addr)


socket.socket.bind = _refuse
