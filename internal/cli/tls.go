package cli

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// tlsFiles are the PEM files of one side of a TLS connection, with etcd's
// flag names.
type tlsFiles struct {
	cert, key, ca string
}

// pool reads a CA bundle.
func pool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return p, nil
}

// config builds a TLS configuration of the files: nil when none is given.
// A server side (server true) needs a certificate and key; with a CA it
// requires client certificates signed by it when requireClient is set,
// and trusts it for the node's own calls to other nodes.
func (f tlsFiles) config(what string, server, requireClient bool) (*tls.Config, error) {
	if f == (tlsFiles{}) {
		if requireClient {
			return nil, fmt.Errorf("%s: client certificate authentication needs TLS: give a certificate, key and trusted CA", what)
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case (f.cert == "") != (f.key == ""):
		return nil, fmt.Errorf("%s: give both a certificate and its key, or neither", what)
	case f.cert != "":
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case server:
		return nil, fmt.Errorf("%s: TLS needs the node's certificate and key", what)
	}
	if f.ca != "" {
		p, err := pool(f.ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		cfg.RootCAs = p
		if server {
			cfg.ClientCAs = p
		}
	}
	if requireClient {
		if f.ca == "" {
			return nil, fmt.Errorf("%s: client certificate authentication needs a trusted CA", what)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// clientTLSFlags registers the client's TLS flags (etcdctl's names), with
// defaults from the environment.
func clientTLSFlags(cmd *cobra.Command, f *tlsFiles) {
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.ca, "cacert", os.Getenv("FENCE_CACERT"), "verify the nodes' TLS certificates with this CA bundle, and talk TLS (env FENCE_CACERT)")
	fl.StringVar(&f.cert, "cert", os.Getenv("FENCE_CERT"), "client certificate for nodes that require one, and talk TLS (env FENCE_CERT)")
	fl.StringVar(&f.key, "key", os.Getenv("FENCE_KEY"), "key of --cert (env FENCE_KEY)")
}
