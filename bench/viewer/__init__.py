"""The viewer: how long `pvpo view` takes to make and open a page for a large evaluation."""
