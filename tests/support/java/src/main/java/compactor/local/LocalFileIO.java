package compactor.local;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.iceberg.Files;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;

/** A FileIO over the local filesystem for {@code file:} URIs and plain paths. */
public final class LocalFileIO implements FileIO {
  public static File local(String location) {
    if (location.startsWith("file://")) {
      return new File(location.substring("file://".length()));
    }
    if (location.startsWith("file:")) {
      return new File(location.substring("file:".length()));
    }
    if (location.contains("://")) {
      throw new IllegalArgumentException("not a local location: " + location);
    }
    return new File(location);
  }

  @Override
  public InputFile newInputFile(String path) {
    InputFile file = Files.localInput(local(path));
    return new InputFile() {
      @Override
      public long getLength() {
        return file.getLength();
      }

      @Override
      public org.apache.iceberg.io.SeekableInputStream newStream() {
        return file.newStream();
      }

      @Override
      public String location() {
        return path;
      }

      @Override
      public boolean exists() {
        return file.exists();
      }
    };
  }

  @Override
  public OutputFile newOutputFile(String path) {
    File target = local(path);
    OutputFile file = Files.localOutput(target);
    FileIO self = this;
    return new OutputFile() {
      @Override
      public PositionOutputStream create() {
        target.getParentFile().mkdirs();
        return file.create();
      }

      @Override
      public PositionOutputStream createOrOverwrite() {
        target.getParentFile().mkdirs();
        return file.createOrOverwrite();
      }

      @Override
      public String location() {
        return path;
      }

      @Override
      public InputFile toInputFile() {
        return self.newInputFile(path);
      }
    };
  }

  @Override
  public void deleteFile(String path) {
    File file = local(path);
    if (file.exists() && !file.delete()) {
      throw new UncheckedIOException(new IOException("cannot delete " + path));
    }
  }
}
