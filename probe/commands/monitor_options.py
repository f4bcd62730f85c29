"""The options every ``probe monitor`` operator command shares: where the service is and how to
reach it (address, token, TLS CA)."""

from __future__ import annotations

import click

addr_option = click.option("--addr", default=None, metavar="HOST:PORT",
                           help="Monitor service address (default: $PROBE_MONITOR or 127.0.0.1:50051).")
token_option = click.option("--token", default=None, envvar="PROBE_MONITOR_TOKEN",
                            help="Token of the service ($PROBE_MONITOR_TOKEN).")
ca_option = click.option("--tls-ca", "ca", default=None, envvar="PROBE_MONITOR_CA",
                         type=click.Path(dir_okay=False),
                         help="PEM CA certificate to trust for a TLS service ($PROBE_MONITOR_CA).")
