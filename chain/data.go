package chain

import (
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"
)

// ServerDataPath is where a server backend serves its data directory
// (psyche server --data): a run's data = "server:NAME" is read from
// ServerDataPath + NAME on the server a trainer talks to.
const ServerDataPath = "/data/"

// ValidDataPath says whether p can name a file of a server's data
// directory: slash-separated names, none empty, ".", ".." or hidden
// (starting with "."), no backslash or NUL. Whatever passes stays inside
// the directory as written; the server also refuses symbolic links out.
func ValidDataPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty path: write server:NAME, a file under the server's --data directory")
	case !utf8.ValidString(p):
		return fmt.Errorf("path %q is not UTF-8", p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute: write it relative to the server's --data directory", p)
	case strings.ContainsAny(p, "\\\x00"):
		return fmt.Errorf("path %q holds a backslash or NUL", p)
	case !fs.ValidPath(p):
		return fmt.Errorf("path %q has an empty, \".\" or \"..\" element: write it relative to the server's --data directory, inside it", p)
	}
	for _, el := range strings.Split(p, "/") {
		if strings.HasPrefix(el, ".") {
			return fmt.Errorf("path %q names a hidden file or directory (%q), which the server does not serve", p, el)
		}
	}
	return nil
}
