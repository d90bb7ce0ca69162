"""Transport: the unix socket the kubelet talks to and the HTTP/2 splice to containerd."""
