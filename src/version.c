/* version.c: the library's version at run time (the header's DSV4_VERSION_STRING is the version a
 * program was compiled against; the two differ when a program meets another installed library). */
#include "dsv4cp.h"

const char *dsv4_version(void) { return DSV4_VERSION_STRING; }
