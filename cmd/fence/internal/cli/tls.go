package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
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
		return nil, errors.New("the file holds no PEM certificate")
	}
	return p, nil
}

// tlsFlagNames are the flags that set each side's files, by the side's
// name as config is given it: a mistake in the files names them.
var tlsFlagNames = map[string]tlsFiles{
	"client TLS": {cert: "--cert", key: "--key", ca: "--cacert"},
	"API TLS":    {cert: "--cert-file", key: "--key-file", ca: "--trusted-ca-file"},
	"peer TLS":   {cert: "--peer-cert-file", key: "--peer-key-file", ca: "--peer-trusted-ca-file"},
}

// config builds a TLS configuration of the files: nil when none is given.
// A server side (server true) needs a certificate and key; with a CA it
// requires client certificates signed by it when requireClient is set,
// and trusts it for the node's own calls to other nodes. what names the
// side ("client TLS"), and so its flags in the errors.
func (f tlsFiles) config(what string, server, requireClient bool) (*tls.Config, error) {
	flag, ok := tlsFlagNames[what]
	if !ok {
		flag = tlsFiles{cert: what + " certificate", key: what + " key", ca: what + " CA"}
	}
	if f == (tlsFiles{}) {
		if requireClient {
			return nil, fmt.Errorf("%s: client certificate authentication needs TLS: give %s, %s and %s", what, flag.cert, flag.key, flag.ca)
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case (f.cert == "") != (f.key == ""):
		return nil, fmt.Errorf("%s: give both %s and %s, or neither", what, flag.cert, flag.key)
	case f.cert != "":
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("%s %s, %s %s: %w", flag.cert, f.cert, flag.key, f.key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case server:
		return nil, fmt.Errorf("%s: TLS needs the node's certificate and key: give %s and %s", what, flag.cert, flag.key)
	}
	if f.ca != "" {
		p, err := pool(f.ca)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", flag.ca, f.ca, err)
		}
		cfg.RootCAs = p
		if server {
			cfg.ClientCAs = p
		}
	}
	if requireClient {
		if f.ca == "" {
			return nil, fmt.Errorf("%s: client certificate authentication needs a trusted CA: give %s", what, flag.ca)
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
