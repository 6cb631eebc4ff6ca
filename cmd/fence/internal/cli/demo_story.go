package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
)

// demoStory is a failure-and-fix story that `fence demo` plays with real
// processes: the article's (a lease lock and a storage, without and with
// fencing tokens), or with --use NAME a recipe's of docs/uses. Each runs
// the same script: worker A gets the lock, A is paused past its TTL while
// B gets it and does the step, A resumes and does the step too. Without the
// fix both steps take effect; with it, A's is refused.
type demoStory struct {
	name  string // as given to --use
	about string // one line, for --use list
	page  string // the recipe's page
	lock  string // the lock or election the workers take
	// on names the lock in the setup's workers line.
	on string
	// heading is the setup's first line; title the picture's.
	heading, title string
	// summary is the last word when every run went as expected.
	summary string
	// lane is the resource's lane on the timeline.
	lane string
	// setup says what stands in for what, one line each, after the lock
	// service's and the workers' lines.
	setup []string
	// runs are played in order; the first is without the fix.
	runs []demoRunSpec
	// prepare makes a fresh resource for a run before its workers start.
	prepare func(ctx context.Context, p *demoPlay) error
	// workerArgs are more arguments for the run's workers, if any.
	workerArgs func(p *demoPlay) []string
	// stepLabel says on the timeline how the resource answered a worker's
	// step; nil for the worker's own message.
	stepLabel func(r *demoRun, ev demoEvent, who string, token uint64) string
	// inspect reads the resource after a run, marks its lane, and judges:
	// it sets the run's ok and verdict.
	inspect func(ctx context.Context, p *demoPlay) error
	// notes describe the story under the picture, before the summary.
	notes func(f demoFlags) []string
	// note describes a recipe's story under the picture.
	note string
	// elected says the lock is an election: the timeline speaks of
	// campaigns, leaders and resignations.
	elected bool
}

// demoRunSpec is one run of a story.
type demoRunSpec struct {
	fix   string // "" for the run without a fix; else the workers' --fix
	title string
}

// useStories are the recipes' stories, in the order --use list shows them.
var useStories = []*demoStory{recipeStory(electionStory), recipeStory(jobOnceStory), recipeStory(inventoryStory)}

// recipeStory fills in what every recipe's story says alike.
func recipeStory(s *demoStory) *demoStory {
	s.on = fmt.Sprintf("%q", s.lock)
	s.heading = fmt.Sprintf("fence demo --use %s: %s (%s), played with real processes", s.name, s.about, s.page)
	s.title = fmt.Sprintf("fence demo --use %s: %s", s.name, s.about)
	s.summary = "Every run went as expected: without the fix the paused worker's late step took effect too; with the fix it was refused."
	s.notes = func(f demoFlags) []string {
		return []string{s.note, fmt.Sprintf("Workers A and B are separate processes with sessions of TTL %v. The recipe: %s.", f.ttl, s.page)}
	}
	return s
}

// findUseStory returns the recipe's story of that name, or nil.
func findUseStory(name string) *demoStory {
	for _, s := range useStories {
		if s.name == name {
			return s
		}
	}
	return nil
}

// listUseStories writes the stories --use knows.
func listUseStories(w *tabwriter.Writer) error {
	fmt.Fprintln(w, "USE\tSTORY\tPAGE")
	for _, s := range useStories {
		fmt.Fprintf(w, "%s\t%s\t%s\n", s.name, s.about, s.page)
	}
	return w.Flush()
}

func useNames() string {
	var names []string
	for _, s := range useStories {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// stepLabelOf says on the timeline how the resource answered a step.
func (s *demoStory) stepLabelOf(r *demoRun, ev demoEvent, who string, token uint64) string {
	if s.stepLabel != nil {
		return s.stepLabel(r, ev, who, token)
	}
	return ev.Message
}

// useFixes are the --fix values the workers know, for their flag's help.
func useFixes() []string {
	var fixes []string
	for _, s := range useStories {
		for _, r := range s.runs {
			if r.fix != "" && !slices.Contains(fixes, r.fix) {
				fixes = append(fixes, r.fix)
			}
		}
	}
	return fixes
}
