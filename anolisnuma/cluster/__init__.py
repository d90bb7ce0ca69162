"""The cluster side: Oenuma rules from the Kubernetes API server, status written back.

Optional and off by default (``[kubernetes] kubeconfig = ""``). Everything here runs on
background threads of its own and never on the CRI path: a CRI call never waits for the
API server, whatever state it is in.

- ``config.py``: the ``[kubernetes]`` section;
- ``kubeconfig.py``: the node's credentials file (server, CA, token or client certificate),
  it and every file it names read only when root alone may change them;
  ``token_file.py``: a token checked and never shown; ``token_auth.py``: the token file's
  token set on each request (read again on a 401);
- ``kube_client.py``: the few requests the daemon makes (list, watch, server-side apply,
  events), made with lightkube, imported only when ``[kubernetes] kubeconfig`` is set;
  ``bounded_transport.py``: a deadline on every request and a size bound on every reply
  and watch event, under lightkube's HTTP client; ``reply_encoding.py``: a compressed
  reply decoded below those bounds (they count what the daemon holds);
- ``oenumas.py``: the Oenuma CRs seen (only what concerns this node is kept, within the
  bounds of ``policies/numa/oenuma_bounds.py``), their rules under the node's trust
  (``policies/numa/oenuma_cr.py``), and the last ones in force persisted;
  ``node_caps.py``: the caps on the entries of all CRs naming the node;
- ``watcher.py``: the ``cluster-watch`` loop (list + watch, bookmarks, relist on 410 Gone,
  reconnect with backoff and jitter);
- ``sync.py``: the ``cluster-rules`` loop (rules to the placement service, which re-pins
  the running pods they name; status back to each CR);
- ``status.py``: what this node writes into a CR's ``status.nodes[]`` (pure);
- ``events.py``: the ``cluster-events`` loop (events sent, in series, rate-limited);
  ``pod_events.py``: the policies' decisions about pods worded as events on them;
  ``cr_events.py``: what a CR did to its pods (re-pinned, not applied, released) told on them.
"""
