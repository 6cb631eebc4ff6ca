// Package deploy holds fence's packaging, checked by its tests: a
// Dockerfile, a systemd unit with its settings file (fence.yaml), a
// Kubernetes StatefulSet for a 3-node group, and a Grafana dashboard. It
// has no code of its own.
package deploy
