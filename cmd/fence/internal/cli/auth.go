package cli

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
)

// authTokenEnv names the file holding the bearer token every client
// command sends. Not FENCE_TOKEN: that is the fencing token fence lock
// gives its command.
const authTokenEnv = "FENCE_AUTH_TOKEN_FILE"

// readAuthToken reads the bearer token from path ("": none): the file's
// first line, without surrounding spaces.
func readAuthToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the auth token (--auth-token-file, %s): %w", authTokenEnv, err)
	}
	token, _, _ := strings.Cut(string(data), "\n")
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("the auth token file %s is empty", path)
	}
	return token, nil
}

func authCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Turn auth on or off, and show who you are",
		Long: `With auth on, every call needs a credential (--auth-token-file, or a
client certificate whose common name is a user, with --client-cert-auth)
and a permission: see fence user, fence role, fence token. Like etcdctl
auth enable, it needs user root with role root first, and the caller's own
credential must be an admin's.`,
	}
	enable := &cobra.Command{
		Use: "enable", Annotations: bounded, Short: "Turn auth on (needs user root with role root, and an admin's credential)", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			if err := c.AuthEnable(cmd.Context()); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "auth enabled")
			return nil
		}),
	}
	disable := &cobra.Command{
		Use: "disable", Annotations: bounded, Short: "Turn auth off: every call is allowed again", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			if err := c.AuthDisable(cmd.Context()); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "auth disabled")
			return nil
		}),
	}
	var asJSON bool
	status := &cobra.Command{
		Use: "status", Annotations: bounded, Short: "Whether auth is on, and who you are to the node", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			st, err := c.AuthStatus(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, st)
			}
			on := "off"
			if st.GetEnabled() {
				on = "on"
			}
			fmt.Fprintf(g.stdout, "auth: %s\n", on)
			if st.GetUser() != "" {
				fmt.Fprintf(g.stdout, "you: %s (by %s), roles %s\n", st.GetUser(), st.GetIdentifiedBy(), orDash(strings.Join(st.GetRoles(), ",")))
			}
			return nil
		}),
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print the API's AuthStatusResponse")
	cmd.AddCommand(enable, disable, status)
	return cmd
}

// simple is a bounded command with exact args that prints done on success.
func simple(g *globals, use, short string, args int, run func(cmd *cobra.Command, c *client.Client, args []string) (string, error)) *cobra.Command {
	return &cobra.Command{
		Use: use, Annotations: bounded, Short: short, Args: cobra.ExactArgs(args),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			done, err := run(cmd, c, args)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, done)
			return nil
		}),
	}
}

func userCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "Add, remove and list users, and give them roles"}
	var asJSON bool
	list := &cobra.Command{
		Use: "list", Annotations: bounded, Short: "List users and their roles", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			users, err := c.Users(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, &fencev1.UserListResponse{Users: users})
			}
			return printTable(g, "USER\tROLES\tSESSIONS\tLOCKS\tWAITS\tKV BYTES\tSESSION RATE", users, func(u *fencev1.User) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", u.GetName(), orDash(strings.Join(u.GetRoles(), ",")),
					usage(u.GetSessions(), u.GetMaxSessions()), usage(u.GetLocks(), u.GetMaxLocks()),
					usage(u.GetWaits(), u.GetMaxWaits()), usage(u.GetKvBytes(), u.GetMaxKvBytes()), sessionRateText(client.QuotaOf(u)))
			})
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the API's UserListResponse")
	var qf quotaFlags
	add := simple(g, "add NAME", "Add a user (no roles; a credential: fence token create, or a certificate with this common name)", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
		q, err := qf.apply(cmd, client.Quota{})
		if err != nil {
			return "", err
		}
		// Checked here too, so that quotas the service would refuse add no
		// user without them.
		if err := checkQuota(q); err != nil {
			return "", err
		}
		if err := c.UserAdd(cmd.Context(), a[0]); err != nil {
			return "", err
		}
		if q == (client.Quota{}) {
			return "added user " + a[0], nil
		}
		return fmt.Sprintf("added user %s with quotas %s", a[0], quotaText(q)), c.UserSetQuota(cmd.Context(), a[0], q)
	})
	qf.register(add)
	setQuota := simple(g, "set-quota NAME", "Set a user's quotas (the flags not given keep their values; 0 removes a limit)", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
		users, err := c.Users(cmd.Context())
		if err != nil {
			return "", err
		}
		i := slices.IndexFunc(users, func(u *client.User) bool { return u.GetName() == a[0] })
		if i < 0 {
			return "", fmt.Errorf("no user %q", a[0])
		}
		q, err := qf.apply(cmd, client.QuotaOf(users[i]))
		if err != nil {
			return "", err
		}
		if err := checkQuota(q); err != nil {
			return "", err
		}
		return fmt.Sprintf("user %s: quotas %s", a[0], quotaText(q)), c.UserSetQuota(cmd.Context(), a[0], q)
	})
	qf.register(setQuota)
	cmd.AddCommand(list, add, setQuota,
		simple(g, "remove NAME", "Remove a user and revoke its tokens", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			return "removed user " + a[0], c.UserRemove(cmd.Context(), a[0])
		}),
		simple(g, "grant-role USER ROLE", "Give a user a role (root: everything)", 2, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			return fmt.Sprintf("granted role %s to %s", a[1], a[0]), c.UserGrantRole(cmd.Context(), a[0], a[1])
		}),
		simple(g, "revoke-role USER ROLE", "Take a role from a user", 2, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			return fmt.Sprintf("revoked role %s from %s", a[1], a[0]), c.UserRevokeRole(cmd.Context(), a[0], a[1])
		}),
	)
	return cmd
}

// quotaFlags are the flags of fence user add and set-quota.
type quotaFlags struct {
	maxSessions, maxLocks, maxWaits, burst uint64
	maxKVBytes                             string
	rate                                   rateValue
}

func (f *quotaFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.Uint64Var(&f.maxSessions, "max-sessions", 0, "live sessions the user may have created, while auth is on (0: no limit)")
	fl.Uint64Var(&f.maxLocks, "max-locks", 0, "locks the user's sessions may hold or wait for (a wait counts; 0: no limit)")
	fl.Uint64Var(&f.maxWaits, "max-waits", 0, "of those, the locks they may wait for at once (0: no limit)")
	fl.StringVar(&f.maxKVBytes, "max-kv-bytes", "0", "bytes (key and value) of the KV keys the user wrote last: 1048576, 64KiB, 1MiB, 1GiB (0: no limit)")
	fl.Var(&f.rate, "session-rate", "sessions the user may create on average, a rate: "+rateSyntax+" (0: the server's --session-rate)")
	fl.Uint64Var(&f.burst, "session-burst", 0, "sessions the user may create at once (default: the rate per second, at least 1)")
}

// apply returns q with the flags given on cmd set.
func (f *quotaFlags) apply(cmd *cobra.Command, q client.Quota) (client.Quota, error) {
	changed := cmd.Flags().Changed
	if changed("max-sessions") {
		q.MaxSessions = f.maxSessions
	}
	if changed("max-locks") {
		q.MaxLocks = f.maxLocks
	}
	if changed("max-waits") {
		q.MaxWaits = f.maxWaits
	}
	if changed("max-kv-bytes") {
		n, err := parseBytes(f.maxKVBytes)
		if err != nil {
			return q, fmt.Errorf("--max-kv-bytes: %w", err)
		}
		q.MaxKVBytes = n
	}
	if changed("session-rate") {
		r := float64(f.rate)
		q.SessionRate = r
		if r == 0 {
			q.SessionBurst = 0
		} else if !changed("session-burst") && q.SessionBurst == 0 {
			q.SessionBurst = uint64(max(1, math.Ceil(r)))
		}
	}
	if changed("session-burst") {
		q.SessionBurst = f.burst
	}
	return q, nil
}

// checkQuota checks q as the service will, naming the flags of each value
// it refuses (--max-locks), not the API's fields (max_locks).
func checkQuota(q client.Quota) error {
	return fsm.CheckQuotaNamed(fsm.Quota(q), quotaFlag)
}

// quotaFlag is the flag of fence user add and set-quota that sets the
// quota field the API names field: max_kv_bytes is --max-kv-bytes.
func quotaFlag(field string) string { return "--" + strings.ReplaceAll(field, "_", "-") }

// parseBytes reads a byte count: digits, with an optional KiB, MiB or GiB.
func parseBytes(s string) (uint64, error) {
	num, mult := s, uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%q is not a number of bytes (1048576, 64KiB, 1MiB, 1GiB)", s)
	}
	return n * mult, nil
}

func quotaText(q client.Quota) string {
	return fmt.Sprintf("sessions %s, locks %s, waits %s, kv bytes %s, session rate %s", limitText(q.MaxSessions), limitText(q.MaxLocks),
		limitText(q.MaxWaits), limitText(q.MaxKVBytes), sessionRateText(q))
}

// sessionRateText is "RATE/s burst N", or "default".
func sessionRateText(q client.Quota) string {
	if q.SessionRate == 0 {
		return "default"
	}
	return fmt.Sprintf("%s/s burst %d", strconv.FormatFloat(q.SessionRate, 'g', 4, 64), q.SessionBurst)
}

// usage is "USED/MAX", or "USED" without a limit.
func usage(used, limit uint64) string {
	if limit == 0 {
		return fmt.Sprint(used)
	}
	return fmt.Sprintf("%d/%d", used, limit)
}

func limitText(n uint64) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}

// parsePermission reads "KIND ACCESS [PREFIX]": lock|kv|admin, read|write.
func parsePermission(args []string) (*client.Permission, error) {
	p := &client.Permission{}
	switch args[0] {
	case "lock":
		p.Kind = client.PermLock
	case "kv":
		p.Kind = client.PermKV
	case "admin":
		p.Kind = client.PermAdmin
	default:
		return nil, fmt.Errorf("permission kind %q is none of lock, kv, admin", args[0])
	}
	switch args[1] {
	case "read":
		p.Access = client.Read
	case "write", "readwrite":
		p.Access = client.Write
	default:
		return nil, fmt.Errorf("access %q is neither read nor write (write includes read)", args[1])
	}
	if len(args) > 2 {
		p.Prefix = args[2]
	}
	return p, nil
}

func permissionText(p *client.Permission) string {
	kind := strings.ToLower(strings.TrimPrefix(p.GetKind().String(), "PERMISSION_KIND_"))
	if p.GetKind() == fencev1.PermissionKind_PERMISSION_KIND_ADMIN {
		return kind
	}
	return fmt.Sprintf("%s %s %q", kind, strings.ToLower(strings.TrimPrefix(p.GetAccess().String(), "ACCESS_")), p.GetPrefix())
}

func roleCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "role", Short: "Add, remove and list roles, and give them permissions on name prefixes"}
	grant := func(use, short, done string, fn func(c *client.Client, cmd *cobra.Command, role string, p *client.Permission) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " ROLE KIND ACCESS [PREFIX]", Annotations: bounded, Short: short,
			Long: short + `. KIND is lock (acquire and release: write; Check, ListLocks: read),
kv (Put, Delete: write; Get, List, Watch: read) or admin (members,
snapshots, sessions revoke, auth; no prefix). ACCESS is read or write
(write includes read). PREFIX is the start of the names allowed ("" or
none: every name); "orders/" allows "orders/17", not "orders".`,
			Args: cobra.RangeArgs(3, 4),
			RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
				p, err := parsePermission(args[1:])
				if err != nil {
					return err
				}
				if err := fn(c, cmd, args[0], p); err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "%s %s: %s\n", done, args[0], permissionText(p))
				return nil
			}),
		}
	}
	var asJSON bool
	list := &cobra.Command{
		Use: "list", Annotations: bounded, Short: "List roles and their permissions", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			roles, err := c.Roles(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, &fencev1.RoleListResponse{Roles: roles})
			}
			return printTable(g, "ROLE\tPERMISSIONS", roles, func(r *fencev1.Role) string {
				var perms []string
				for _, p := range r.GetPermissions() {
					perms = append(perms, permissionText(p))
				}
				return fmt.Sprintf("%s\t%s", r.GetName(), orDash(strings.Join(perms, "; ")))
			})
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the API's RoleListResponse")
	cmd.AddCommand(list,
		simple(g, "add NAME", "Add a role without permissions", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			return "added role " + a[0], c.RoleAdd(cmd.Context(), a[0])
		}),
		simple(g, "remove NAME", "Remove a role, taking it from every user", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			return "removed role " + a[0], c.RoleRemove(cmd.Context(), a[0])
		}),
		grant("grant", "Give a role a permission", "granted", func(c *client.Client, cmd *cobra.Command, role string, p *client.Permission) error {
			return c.RoleGrant(cmd.Context(), role, p)
		}),
		grant("revoke", "Take a permission from a role", "revoked", func(c *client.Client, cmd *cobra.Command, role string, p *client.Permission) error {
			return c.RoleRevoke(cmd.Context(), role, p)
		}),
	)
	return cmd
}

func tokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke bearer tokens"}
	var ttl time.Duration
	var description, out string
	create := &cobra.Command{
		Use: "create USER", Annotations: bounded, Short: "Make a bearer token for USER, printed once",
		Long: `Makes a bearer token for USER and prints it (or writes it to --out,
mode 0600): the service keeps only its hash, so it cannot be shown again.
Send it with --auth-token-file FILE (env ` + authTokenEnv + `), client.WithBearerToken,
or curl -H "Authorization: Bearer TOKEN".`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			var f *privateFile
			if out != "" {
				var err error
				if f, err = openPrivate(out); err != nil {
					return fmt.Errorf("no token was made: %w", err)
				}
				defer f.Close()
			}
			token, info, err := c.TokenCreate(cmd.Context(), args[0], ttl, description)
			if err != nil {
				return err
			}
			if f != nil {
				if err := f.replace(token + "\n"); err != nil {
					return fmt.Errorf("token %d was made, but writing it failed (revoke it): %w", info.GetId(), err)
				}
				fmt.Fprintf(g.stdout, "token %d for %s written to %s\n", info.GetId(), args[0], out)
				return nil
			}
			fmt.Fprintln(g.stdout, token)
			return nil
		}),
	}
	create.Flags().DurationVar(&ttl, "ttl", 0, "the token expires after this long (0: when revoked)")
	create.Flags().StringVar(&description, "description", "", "what the token is for, shown by fence token list")
	create.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	var asJSON bool
	var user string
	list := &cobra.Command{
		Use: "list", Annotations: bounded, Short: "List tokens (never their secrets)", Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			tokens, err := c.Tokens(cmd.Context(), user)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, &fencev1.TokenListResponse{Tokens: tokens})
			}
			return printTable(g, "ID\tUSER\tCREATED\tEXPIRES\tDESCRIPTION", tokens, func(t *fencev1.TokenInfo) string {
				expires := "-"
				if t.GetExpires() != nil {
					expires = t.GetExpires().AsTime().UTC().Format(time.RFC3339)
				}
				return fmt.Sprintf("%d\t%s\t%s\t%s\t%s", t.GetId(), t.GetUser(), t.GetCreated().AsTime().UTC().Format(time.RFC3339), expires, orDash(t.GetDescription()))
			})
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the API's TokenListResponse")
	list.Flags().StringVar(&user, "user", "", "only this user's tokens")
	cmd.AddCommand(create, list,
		simple(g, "revoke ID", "Revoke a token (an id from fence token list): its next call is refused", 1, func(cmd *cobra.Command, c *client.Client, a []string) (string, error) {
			id, err := strconv.ParseUint(a[0], 10, 64)
			if err != nil || id == 0 {
				return "", fmt.Errorf("%q is not a token id (a number from 1 up, as fence token list shows)", a[0])
			}
			return "revoked token " + a[0], c.TokenRevoke(cmd.Context(), id)
		}),
	)
	return cmd
}

// privateFile is a file opened for a secret by openPrivate.
type privateFile struct {
	*os.File
	regular bool // emptied before it is written; a device or a pipe is not
}

// openPrivate opens the file at path for a secret, readable by its owner
// alone (mode 0600) before anything is written to it: one that exists
// keeps its mode when opened, so a regular file is changed to 0600 first.
// A device or a pipe (/dev/stdout) is left as it is. What the file holds
// is left too, for replace once the caller has the secret.
func openPrivate(path string) (*privateFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	regular := err == nil && fi.Mode().IsRegular()
	if regular && fi.Mode().Perm() != 0o600 {
		err = f.Chmod(0o600)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("making %s readable by its owner alone: %w", path, err)
	}
	return &privateFile{File: f, regular: regular}, nil
}

// replace writes text as all the file holds, and closes it.
func (p *privateFile) replace(text string) error {
	var err error
	if p.regular {
		err = p.Truncate(0)
	}
	if err == nil {
		_, err = p.WriteString(text)
	}
	if err == nil {
		err = p.Close()
	}
	return err
}
