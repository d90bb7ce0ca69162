"""The wire layer of anolisnuma's NRI (containerd Node Resource Interface) plugin.

- :mod:`anolisnuma.nri.frames` — pure codecs, no I/O: NRI's connection multiplexer (8-byte
  frames over the one Unix socket) and ttrpc's messages (10-byte header) on each logical
  connection, with every length bounded before anything is buffered.
- :mod:`anolisnuma.nri.session` — the plugin's side of one NRI connection on blocking
  sockets and threads: serves ``nri.pkg.api.v1alpha1.Plugin`` requests from the runtime on
  a bounded worker pool and makes ``nri.pkg.api.v1alpha1.Runtime`` calls to it.

The messages are NRI v0.11.0's, generated in the top-level package ``nri_proto``.
The plugin logic (which events, what to adjust) lives above this layer.
"""
