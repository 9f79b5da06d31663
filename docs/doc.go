// Package docs holds sbclaim's guides (the Markdown files beside this one,
// indexed by README.md here) and the tests that keep them true: every Go
// snippet in the repository's README.md and in these guides is taken from
// a source file that compiles and is tested (TestSnippetsMatchTheirSources),
// the shell commands of the README's first page are ones a test or CI runs
// (TestFirstPageCommandsAreExercised), relative links and their anchors
// resolve (TestLinksResolve), the outcome table lists every outcome the
// processor reports (TestOutcomeTableListsEveryResult), and the
// configuration tables list exactly the variables the binaries read
// (TestConfigurationTablesMatchTheBinaries).
//
// A snippet is marked in the Markdown by an HTML comment on the line
// before its code block, naming its source:
//
//	<!-- snippet: examples/stripe/main.go func Charge -->
//	<!-- snippet: docs/library_test.go region handler-test -->
//
// "func Name" takes a function declaration (without its doc comment);
// "region name" takes the lines between "// snippet:name" and the next
// "// endsnippet" in the source, de-indented. After changing a source, run
//
//	SBCLAIM_UPDATE_SNIPPETS=1 go test ./docs -run TestSnippetsMatchTheirSources
//
// to copy it into the Markdown.
package docs
