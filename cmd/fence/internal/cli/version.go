package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/internal/buildinfo"
)

func versionCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print fence's module version, VCS revision and Go version (as --version does)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := buildinfo.Read()
			if !asJSON {
				_, err := fmt.Fprint(g.stdout, info.String())
				return err
			}
			return printJSONValue(g, map[string]any{
				"version": info.Version, "revision": info.Revision, "modified": info.Modified,
				"time": info.Time, "goVersion": info.GoVersion,
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"version", "revision", "modified", "time", "goVersion"}`)
	return cmd
}
